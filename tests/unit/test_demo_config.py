"""``fedstream demo``'s options: its training options are run-config overrides, checked by the
run settings like any run's."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
from typer.main import get_command

from deploy.cli import app
from deploy.demo import DemoConfig, _run_settings
from deploy.demo_streams import ingest_args as _ingest_args
from deploy.demo_streams import source_args as _source_args
from deploy.demo_streams import write_shards as _write_shards
from deploy.demo_view import infer_command as _infer_command
from edge_client.emulation.people import PEOPLE_KEY, people_recording
from edge_client.task.recordings import load_series
from edge_client.wire.run_config import RunSettings


def test_the_demo_trains_with_its_defaults_over_the_apps() -> None:
    # Execute
    config = DemoConfig(devices=3)
    # Assert: the demo's own defaults, the fleet's, and the app's for everything else
    s = config.settings
    assert (s.num_rounds, s.local_steps, s.min_nodes, s.b_min) == (6, 60, 3, 8)
    assert s.model_width == 96  # local work that compute times dominate
    assert s.lr == RunSettings().lr and s.controller == RunSettings().controller


def test_options_and_run_config_override_and_are_checked_as_a_run_config() -> None:
    # Execute
    config = DemoConfig(run_config={"num-rounds": 3, "deadband": 0.25, "compress": "topk"})
    # Assert
    assert (config.settings.num_rounds, config.settings.deadband) == (3, 0.25)
    assert config.settings.compress == "topk"
    with pytest.raises(ValueError, match="deadband must be in"):
        DemoConfig(run_config={"deadband": 2.0})
    with pytest.raises(ValueError, match="unknown keys"):
        DemoConfig(run_config={"rounds": 3})


def test_fault_options_are_checked_against_the_run_config() -> None:
    with pytest.raises(ValueError, match=r"--kill-aggregator must be in 1\.\.2"):
        DemoConfig(run_config={"num-rounds": 3}, kill_aggregator=3)
    assert DemoConfig(run_config={"num-rounds": 3}, kill_aggregator=2).kill_aggregator == 2


def test_keys_the_demo_sets_or_cannot_honour_are_refused() -> None:
    with pytest.raises(ValueError, match="sets \\['out-dir'\\] itself"):
        DemoConfig(run_config={"out-dir": "/tmp/elsewhere"})
    with pytest.raises(ValueError, match=r"streams set \['dataset', 'num-classes'\]"):
        DemoConfig(run_config={"dataset": "digits", "num-classes": 10})


def test_b_min_follows_the_global_batch_the_run_asks_for() -> None:
    # 4 devices sharing B = 16 get at most 4 each: b-min comes down with it.
    assert DemoConfig(run_config={"global-batch": 16}).settings.b_min == 4
    assert DemoConfig(run_config={"global-batch": 16, "b-min": 2}).settings.b_min == 2


def test_a_recording_sets_the_shape_classes_model_and_test_file(tmp_path: Path) -> None:
    # Prepare: a recording of 3 x 50 windows in 4 classes, and flat 561-feature rows.
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "rec.npz", x=rng.normal(size=(40, 3, 50)), y=rng.integers(0, 4, 40))
    np.savez(tmp_path / "test.npz", x=rng.normal(size=(10, 3, 50)), y=rng.integers(0, 4, 10))
    np.savez(tmp_path / "flat.npz", x=rng.normal(size=(40, 561)), y=rng.integers(0, 3, 40))
    # Execute
    windows = DemoConfig(source=tmp_path / "rec.npz", test=tmp_path / "test.npz").settings
    flat = DemoConfig(source=tmp_path / "flat.npz").settings
    # Assert
    assert (windows.shape, windows.num_classes, windows.model) == ((3, 50), 4, "cnn")
    assert windows.eval_data == str((tmp_path / "test.npz").resolve())
    assert (flat.shape, flat.num_classes, flat.model, flat.eval_data) == ((561,), 3, "mlp", "")
    assert DemoConfig().settings.eval_data == "synthetic"  # the built-in task's held-out set
    # a recording is in its sensors' units: every device standardises its own stream
    assert windows.preprocess == flat.preprocess == "standardize"
    assert DemoConfig().settings.preprocess == "none"
    with pytest.raises(ValueError, match="has \\(3, 50\\) and 4 classes"):
        DemoConfig(source=tmp_path / "rec.npz", test=tmp_path / "flat.npz")
    with pytest.raises(ValueError, match="give its --source"):
        DemoConfig(test=tmp_path / "test.npz")
    with pytest.raises(ValueError, match="no such file"):
        DemoConfig(source=tmp_path / "missing.npz")


def test_a_series_for_forecasting_is_split_in_time_and_published_reading_by_reading(
    tmp_path: Path,
) -> None:
    # Prepare: a two-channel series with a time column and a missing reading.
    lines = ["date,temp,humidity"] + [f"{d},{20 + d % 7},{50 + d % 5}" for d in range(100)]
    lines[10] = "9,,54"
    (tmp_path / "series.csv").write_text("\n".join(lines) + "\n")
    # Execute
    config = DemoConfig(source=tmp_path / "series.csv", task="forecast", window=12)
    shards = _write_shards(config, tmp_path / "run")
    # Assert: 2 channels x 12 readings; 4 stretches of 25 readings in time order, each a
    # CSV with the channels' names that its device publishes and ingest windows (14 each)
    settings = config.settings
    assert (settings.task, settings.shape) == ("forecast", (2, 12))
    assert config.channels == ["temp", "humidity"] and config.recording is None
    assert shards == {f"dev-{i}": 25 - 12 + 1 for i in range(4)}
    dev1 = load_series(tmp_path / "run" / "data" / "dev-1.csv")
    assert np.allclose(dev1, load_series(tmp_path / "series.csv")[25:50])
    assert _ingest_args(config, "dev-1", 1) == [
        "--fields", "temp,humidity", "--window", "12", "--stride", "1", "--commit-interval", "0.5",
    ]  # fmt: skip
    assert "--readings" in _source_args(config, tmp_path / "run", "dev-1")
    # ... and as deployed sensors publish it: Sparkplug B, one stream a metric on a grid at
    # the device's rate (dev-1's: 300/s)
    spb = DemoConfig(source=tmp_path / "series.csv", task="forecast", window=12, style="sparkplug")
    assert _ingest_args(spb, "dev-1", 1)[:9] == [
        "--payload", "sparkplug", "--topic", "spBv1.0/fedstream/DDATA/dev-1/sensors",
        "--fields", "temp,humidity", "--rate", "300.0", "--window",
    ]  # fmt: skip
    assert _source_args(spb, tmp_path / "run", "dev-1")[-2:] == ["--style", "sparkplug"]
    with pytest.raises(ValueError, match="--task forecast"):
        DemoConfig(style="esphome")
    with pytest.raises(ValueError, match="give --source"):
        DemoConfig(task="forecast")
    with pytest.raises(ValueError, match="classification or forecast"):
        DemoConfig(source=tmp_path / "series.csv", task="ranking")


def test_the_demo_exports_its_final_model_into_its_run_folder_unless_told_where(
    tmp_path: Path,
) -> None:
    # Prepare: the default, an export-dir of the user's, an export-every of the user's
    run = tmp_path / "run-1"
    chosen = DemoConfig(run_config={"export-dir": str(tmp_path / "mine")})
    # Execute
    default = _run_settings(DemoConfig(), run)
    theirs = _run_settings(chosen, run)
    every = _run_settings(DemoConfig(run_config={"export-every": 2}), run)
    # Assert: <run>/models, the final model only (an export costs a round seconds) unless
    # asked; what the user chose stays as chosen
    assert (default.export_dir, default.export_every) == (str(run / "models"), 0)
    assert (theirs.export_dir, theirs.export_every) == (str(tmp_path / "mine"), 5)
    assert (every.export_dir, every.export_every) == (str(run / "models"), 2)
    assert (default.out_dir, default.checkpoint_dir) == (str(run), str(run / "checkpoint"))


def test_the_printed_infer_command_serves_the_export_on_a_devices_stream(tmp_path: Path) -> None:
    # Prepare: the built-in task, and a two-channel series forecast from windows of 12
    lines = ["date,temp,humidity"] + [f"{d},{20 + d % 7},{50 + d % 5}" for d in range(100)]
    (tmp_path / "series.csv").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run-1"
    samples = DemoConfig()
    series = DemoConfig(
        source=tmp_path / "series.csv", task="forecast", window=12, broker="mqtt://pi:1884"
    )
    # Execute
    commands = [_infer_command(c, _run_settings(c, run)) for c in (samples, series)]
    # Assert: dev-0's stream, the run's models folder, the series' windows as ingest cut
    # them, the broker the demo was given (else fedstream broker's default, which speaks
    # MQTT 3.1.1 only); and `fedstream infer` takes every option
    assert commands[0] == (
        "fedstream infer --broker mqtt://127.0.0.1:1883 --mqtt-version 3.1.1 --device-id dev-0 "
        f"--model {run}/models"
    )
    assert commands[1] == (
        f"fedstream infer --broker mqtt://pi:1884 --device-id dev-0 --model {run}/models "
        "--fields temp,humidity --window 12 --stride 1"
    )
    # as ESPHome publishes it: its topics, each channel a stream on a grid at dev-0's rate
    esphome = DemoConfig(source=tmp_path / "series.csv", task="forecast", window=12,
                         style="esphome")  # fmt: skip
    commands.append(_infer_command(esphome, _run_settings(esphome, run)))
    assert commands[2].endswith(
        "--payload plain --time-field none --topic esphome/dev-0/sensor/+/state "
        "--fields temp,humidity --rate 400.0 --window 12 --stride 1"
    )
    infer = get_command(app).commands["infer"]  # type: ignore[attr-defined]
    for command in commands:  # raises on an unknown option
        infer.make_context("infer", shlex.split(command)[2:])


def test_a_recording_partitioned_by_person_gives_each_device_one_person_in_order(
    tmp_path: Path,
) -> None:
    # Prepare: 3 people streaming, 2 held out (the test file holds the key too)
    people = people_recording(5, seed=1)
    source = people.where([1, 2, 3]).save(tmp_path / "train.npz")
    test = people.where([4, 5]).save(tmp_path / "test.npz")
    # Execute: devices 0 (no --devices): one per group
    config = DemoConfig(devices=0, source=source, test=test, partition_by=PEOPLE_KEY)
    counts = _write_shards(config, tmp_path / "run")
    # Assert: 3 devices, dev-i streaming person i+1's windows exactly, in recorded order;
    # the held-out people scored apart
    assert config.devices == 3 and config.groups == ["subject-1", "subject-2", "subject-3"]
    for i, person in enumerate((1, 2, 3)):
        shard = np.load(tmp_path / "run" / "data" / f"dev-{i}.npz")
        mine = people.where([person])
        assert np.array_equal(shard["x"], mine.x) and np.array_equal(shard["y"], mine.y)
        assert counts[f"dev-{i}"] == len(mine.y)
    assert config.settings.eval_group_by == PEOPLE_KEY and config.settings.min_nodes == 3
    # --devices N takes the first N groups; more groups than the demo runs is refused
    assert DemoConfig(devices=2, source=source, partition_by=PEOPLE_KEY).groups == [
        "subject-1",
        "subject-2",
    ]
    with pytest.raises(ValueError, match="splits into 3"):
        DemoConfig(devices=4, source=source, partition_by=PEOPLE_KEY)
    with pytest.raises(ValueError, match="fedstream simulate"):
        many = people_recording(70, seed=0).save(tmp_path / "many.npz")
        DemoConfig(devices=0, source=many, partition_by=PEOPLE_KEY)
    with pytest.raises(ValueError, match="give --source"):
        DemoConfig(partition_by=PEOPLE_KEY)
