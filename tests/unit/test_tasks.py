"""Tasks a user brings: their model or whole task by import path or from Python, their
sample shape (devices of another shape are left out, with the reason), preprocessing kept on
the device, and prequential evaluation (test, then train) on the devices."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aggregator.checkpoint import load_checkpoint
from aggregator.round_log import FORMAT_VERSION, RoundRecord, rounds_only
from aggregator.server_app import run_rounds
from deploy.constants import FORECAST_LR
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.report import summarize
from edge_client.emulation.accelerometer import accelerometer_series
from edge_client.emulation.sources import ArraySource, SyntheticSource
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.client_app import make_client_app
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.task.forecasting import Forecast
from edge_client.task.interface import Classification, evaluate
from edge_client.task.loading import load_task
from edge_client.task.preprocess import ChannelStandardizer
from edge_client.task.recordings import load_recording, series_windows
from edge_client.task.synthetic import SensorTask
from edge_client.wire.constants import NO_LABEL
from edge_client.wire.run_config import RunSettings, upgrade_saved
from tests.tasks import SampleLog, TinyTask

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]


def _weights(checkpoint_dir: str) -> dict[str, torch.Tensor]:
    checkpoint = load_checkpoint(checkpoint_dir)
    assert checkpoint is not None
    return checkpoint.arrays.to_torch_state_dict()


# -- user tasks ----------------------------------------------------------------------------


def test_a_user_model_named_in_the_run_config_learns(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: the user's own nn.Module, by import path.
    settings = fast(model="tests.tasks:TinyNet", num_rounds=5, checkpoint_dir=str(tmp_path / "c"))
    grid = InProcessGrid(fleet(1, 1), tmp_path / "b", settings)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: it is the user's model that was trained, and it learned.
    assert set(_weights(settings.checkpoint_dir)) == {
        "body.1.weight", "body.1.bias", "body.3.weight", "body.3.bias",
    }  # fmt: skip
    assert records[-1].test_accuracy > 1 / 6 + 0.2
    assert records[-1].eval_count > 0 and records[-1].accuracy > 1 / 6 + 0.1


def test_a_user_task_by_import_path_and_from_python_train_the_same_model(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: the same Task, named in the run config, or handed to the app factories.
    # (The fixed controller: measured step times would make the two plans differ.)
    by_path = fast(
        task="tests.tasks:TinyTask", controller="fixed", checkpoint_dir=str(tmp_path / "a")
    )
    by_object = fast(controller="fixed", checkpoint_dir=str(tmp_path / "b"))
    # Execute
    grid = InProcessGrid(fleet(1, 2), tmp_path / "ba", by_path)
    run_rounds(grid, by_path)
    grid.close()
    task = TinyTask()
    grid = InProcessGrid(fleet(1, 2), tmp_path / "bb", by_object, make_client_app(task))
    run_rounds(grid, by_object, task=task)
    grid.close()
    # Assert: bit for bit the same weights, of the user's model.
    a, b = _weights(by_path.checkpoint_dir), _weights(by_object.checkpoint_dir)
    assert set(a) == {"body.1.weight", "body.1.bias", "body.3.weight", "body.3.bias"}
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task": "tests.no_such_module:Task"}, "cannot import 'tests.no_such_module'"),
        ({"task": "tests.tasks:Missing"}, "has no 'Missing'"),
        ({"task": "tests.tasks:NOT_A_TASK"}, "not a fedstream Task"),
        ({"model": "tests.tasks:NOT_A_TASK"}, "need an nn.Module class"),
    ],
)
def test_a_task_or_model_that_does_not_load_says_why(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_task(RunSettings(**overrides))


def test_run_config_refuses_malformed_tasks_models_and_shapes() -> None:
    with pytest.raises(ValueError, match="import path"):
        RunSettings(task="my task")
    with pytest.raises(ValueError, match="import path"):
        RunSettings(model="resnet")
    for shape in ("", "6,0", "a,b", "1,2,3,4,5"):
        with pytest.raises(ValueError, match="sample-shape"):
            RunSettings(sample_shape=shape)
    assert RunSettings(sample_shape="3,50").shape == (3, 50)


def test_a_user_model_that_does_not_fit_the_shape_fails_with_its_reason() -> None:
    # The CNN needs (channels, steps); a flat sample gets a message that says what to set.
    with pytest.raises(ValueError, match="set model = 'mlp'"):
        load_task(RunSettings(sample_shape="561")).build_model((561,), 6)


# -- shapes from the data ------------------------------------------------------------------


def test_a_device_of_another_shape_is_left_out_with_its_reason(
    tmp_path: Path, fast: Fast, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: dev-2's sensors send 3 x 50 windows; the run declares 6 x 32.
    other = SyntheticSource(SensorTask((3, 50), 6), np.random.default_rng(0))
    devices = [VirtualDevice("dev-0"), VirtualDevice("dev-1"), VirtualDevice("dev-2", source=other)]
    settings = fast(controller="fixed")
    grid = InProcessGrid(devices, tmp_path, settings)
    # Execute
    with caplog.at_level(logging.WARNING, logger="aggregator.strategy"):
        records = run_rounds(grid, settings)
    stats = grid.stores[grid_node(grid, "dev-2")].stats()
    grid.close()
    # Assert: the others train; dev-2 is refused every round, counted by reason, logged once.
    for record in records:
        assert record.aggregated == ["dev-0", "dev-1"]
    assert records[-1].rejected == {"dev-2": 3}
    assert records[-1].rejected_reasons == {"shape-mismatch": 3}
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.strategy"]
    assert len(lines) == 1 and "3x50" in lines[0] and "6x32" in lines[0]
    assert stats["consumed"] == 0 and stats["fill"] > 0  # its samples were left in its buffer
    assert records[-1].test_accuracy > 1 / 6


def grid_node(grid: InProcessGrid, device_id: str) -> int:
    return next(n for n, d in grid.devices.items() if d.device_id == device_id)


# -- prequential evaluation ----------------------------------------------------------------


def test_prequential_evaluation_never_scores_a_sample_the_model_has_trained_on(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: every sample carries its id in its first value; device k's ids are k * 10^5 +
    # i, replayed in order. Both devices share samples (ScaDLES injection) and mix pooled ones
    # into their batches.
    def stream(k: int) -> ArraySource:
        rng = np.random.default_rng(k)
        x = rng.normal(size=(20_000, 6, 32)).astype(np.float32)
        x[:, 0, 0] = k * 100_000 + np.arange(20_000)
        return ArraySource(x, rng.integers(0, 6, 20_000), rng)

    devices = [VirtualDevice(f"dev-{k}", source=stream(k), inject=True) for k in range(2)]
    # (a learning rate small enough for inputs of 10^5: a diverged device's reply is refused)
    settings = fast(
        num_rounds=4, controller="fixed", inject_alpha=1.0, inject_mix=0.25, eval_data="",
        lr=1e-6,
    )  # fmt: skip
    task = SampleLog()
    grid = InProcessGrid(devices, tmp_path, settings, make_client_app(task))
    # Execute
    records = run_rounds(grid, settings, task=task)
    grid.close()
    # Assert: each scored sample is scored before any model trained on it, and is one of the
    # scoring device's own (never a pooled one).
    trained: set[int] = set()
    scored = 0
    for phase, ids in task.events:
        if phase == "eval":
            assert not trained & set(ids)
            assert len({i // 100_000 for i in ids}) == 1
            scored += len(ids)
        else:
            trained |= set(ids)
    assert any(len({i // 100_000 for i in ids}) == 2 for p, ids in task.events if p == "train")
    # ... and each reply counts exactly its own samples: trained minus drawn from the pool.
    for record in records:
        for m in record.devices.values():
            assert m.eval_count == m.num_examples - m.inject_used
        assert record.eval_count == sum(m.eval_count for m in record.devices.values())
    assert scored == sum(r.eval_count for r in records)
    assert math.isnan(records[-1].test_accuracy)  # no eval-data: the aggregator has none


def test_the_round_accuracy_is_the_sample_weighted_mean_of_the_devices(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    settings = fast()
    grid = InProcessGrid(fleet(1, 4), tmp_path, settings)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    grid.close()
    # Assert
    for record in records:
        devices = record.devices.values()
        weighted = sum(m.eval_metric * m.eval_count for m in devices)
        assert record.eval_count == sum(m.eval_count for m in devices) > 0
        assert record.accuracy == pytest.approx(weighted / record.eval_count)
        assert record.loss == pytest.approx(
            sum(m.eval_loss * m.eval_count for m in devices) / record.eval_count
        )


def test_evaluate_in_chunks_is_the_mean_over_all_samples() -> None:
    # Prepare
    torch.manual_seed(0)
    task = Classification("mlp")
    model = task.build_model((6, 32), 6)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2500, 6, 32)).astype(np.float32)
    y = rng.integers(0, 6, 2500)
    # Execute
    scores = evaluate(task, model, x, y)
    # Assert: over 3 chunks, as one pass over everything.
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        whole_loss = torch.nn.functional.cross_entropy(logits, target).item()
        whole_acc = (logits.argmax(1) == target).float().mean().item()
    assert scores.count == 2500
    assert scores.metric == pytest.approx(whole_acc, abs=1e-6)
    assert scores.loss == pytest.approx(whole_loss, rel=1e-5)
    assert math.isnan(evaluate(task, model, x[:0], y[:0]).metric)


# -- preprocessing kept on the device ------------------------------------------------------


def test_channel_standardizer_matches_the_statistics_of_everything_seen() -> None:
    # Prepare: three batches of different sizes; channel c has mean c and scale c + 1.
    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(n, 3, 5)) * np.array([1, 2, 3])[:, None] + np.arange(3)[:, None]).astype(
            np.float32
        )
        for n in (1, 7, 40)
    ]
    everything = np.concatenate(batches).astype(np.float64)
    standardizer = ChannelStandardizer()
    untouched = standardizer(batches[0])
    # Execute
    for batch in batches:
        standardizer.update(batch)
    restored = ChannelStandardizer()
    restored.load_state_dict(standardizer.state_dict())
    out = restored(everything.astype(np.float32))
    # Assert: the identity before any sample; then every channel mean 0, std 1 over all seen
    np.testing.assert_array_equal(untouched, batches[0])
    assert standardizer.mean is not None and standardizer.std is not None
    np.testing.assert_allclose(standardizer.mean, everything.mean(axis=(0, 2)), atol=1e-9)
    np.testing.assert_allclose(standardizer.std, everything.std(axis=(0, 2)), rtol=1e-9)
    np.testing.assert_allclose(out.mean(axis=(0, 2)), 0, atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(0, 2)), 1, atol=1e-5)
    with pytest.raises(ValueError, match="standardiser"):
        ChannelStandardizer().load_state_dict({"count": 1, "mean": [0.0], "m2": [1.0, 2.0]})


def test_standardisation_state_is_kept_per_device_in_its_buffer_file(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: two devices whose sensors differ in gain and offset.
    devices = [VirtualDevice(f"dev-{i}", feature_shift=1.0) for i in range(2)]
    settings = fast(preprocess="standardize", num_rounds=3)
    grid = InProcessGrid(devices, tmp_path, settings)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    paths = [store.path for store in grid.stores.values()]
    grid.close()
    # Assert: each device's statistics cover exactly the samples it took, and differ.
    states = []
    for path, device in zip(paths, ("dev-0", "dev-1"), strict=True):
        standardizer = ChannelStandardizer()
        with DeviceStateStore(path) as state:
            state.load_preprocessor(standardizer)
        taken = sum(r.devices[device].num_examples for r in records)
        assert standardizer.count == taken * 32  # values per channel: samples x steps
        assert standardizer.mean is not None
        states.append(standardizer.mean)
    assert not np.allclose(states[0], states[1])


# -- recordings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((3, 2)), "y": np.zeros(2)}, "3 samples but 2 labels"),
        ({"x": np.zeros((2, 2)), "y": np.array([0, -1])}, "whole numbers >= 0"),
        ({"x": np.zeros((2, 2)), "y": np.array([0, 0.5])}, "whole numbers >= 0"),
        ({"x": np.full((2, 2), np.nan), "y": np.zeros(2)}, "NaN"),
        ({"samples": np.zeros((2, 2))}, "needs arrays 'x' and 'y'"),
        ({"x": np.zeros((0, 2)), "y": np.zeros(0)}, "no samples"),
    ],
)
def test_a_bad_recording_is_refused_with_its_reason(
    tmp_path: Path, arrays: dict[str, Any], message: str
) -> None:
    np.savez(tmp_path / "r.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        load_recording(tmp_path / "r.npz")


def test_a_corrupt_or_ragged_recording_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.npz").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "r.csv").write_text("0,1,2\n1,3\n")
    with pytest.raises(ValueError, match="not a readable"):
        load_recording(tmp_path / "r.npz")
    with pytest.raises(ValueError, match="different widths"):
        load_recording(tmp_path / "r.csv")
    with pytest.raises(ValueError, match="no such file"):
        load_recording(tmp_path / "missing.npz")


def test_buffer_store_keeps_the_shape_a_device_was_set_up_with(tmp_path: Path) -> None:
    with BufferStore(tmp_path / "b.sqlite", shape=(3, 50)) as store:
        assert store.shape == (3, 50)


# -- runs and files from before prequential evaluation -------------------------------------


def test_a_format_1_line_reads_its_accuracy_as_the_aggregators_and_nan_stays_json(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a line as the release before wrote it (format 1: accuracy was the aggregator's).
    settings = fast(num_rounds=1, eval_data="", out_dir=str(tmp_path / "out"))
    grid = InProcessGrid(fleet(1), tmp_path / "b", settings)
    (new,) = rounds_only(run_rounds(grid, settings))
    grid.close()
    old = json.loads(new.to_json())
    old.update({"format-version": 1, "accuracy": 0.61, "loss": 1.1})
    for key in ("test-accuracy", "test-loss", "eval-count", "metric"):
        old.pop(key)
    # Execute
    read_old = RoundRecord.from_json(json.dumps(old))
    line = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1]  # after the probe's
    read_new = RoundRecord.from_json(line)
    # Assert: the old score moved to test-accuracy; a round without eval-data writes null
    # (strict JSON) and reads NaN again.
    assert (read_old.test_accuracy, read_old.test_loss) == (0.61, 1.1)
    assert math.isnan(read_old.accuracy) and read_old.format_version == FORMAT_VERSION
    assert "NaN" not in line and json.loads(line)["test-accuracy"] is None
    assert math.isnan(read_new.test_accuracy) and read_new.accuracy == new.accuracy


def test_a_checkpoint_from_before_sample_shape_resumes_as_it_ran(tmp_path: Path) -> None:
    # Prepare: run configs a checkpoint of the release before holds (no sample-shape, no
    # eval-data: the model's shape was the dataset's, and the dataset's held-out set scored).
    old = RunSettings().to_run_config()
    for key in ("sample-shape", "eval-data", "task", "preprocess"):
        old.pop(key)
    digits = {**old, "dataset": "digits", "num-classes": 10}
    # Execute
    synthetic_run = RunSettings.from_run_config(upgrade_saved(old))
    digits_run = RunSettings.from_run_config(upgrade_saved(digits))
    # Assert
    assert (synthetic_run.shape, synthetic_run.eval_data) == ((6, 32), "synthetic")
    assert (digits_run.shape, digits_run.eval_data) == ((8, 8), "digits")
    with pytest.raises(ValueError, match="sample-shape='8,8'"):
        RunSettings.from_run_config(digits)  # what a resume did before upgrade_saved


def test_a_resume_takes_a_shape_written_either_way_and_refuses_another(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a checkpoint of a run whose sample-shape was written "6x32".
    ckpt = str(tmp_path / "c")
    first = fast(num_rounds=1, sample_shape="6x32", checkpoint_dir=ckpt)
    grid = InProcessGrid(fleet(1), tmp_path / "b", first)
    run_rounds(grid, first)
    grid.close()
    # Execute / Assert: "6,32" is the same shape; 3,64 is another model.
    grid = InProcessGrid(fleet(1), tmp_path / "b2", fast())
    assert len(run_rounds(grid, fast(num_rounds=2, checkpoint_dir=ckpt, resume=True))) == 1
    with pytest.raises(ValueError, match="sample-shape"):
        run_rounds(grid, fast(num_rounds=3, sample_shape="3,64", checkpoint_dir=ckpt, resume=True))
    grid.close()


# -- forecasting: a task without labels ----------------------------------------------------


def test_forecast_targets_are_cut_from_the_window_relative_to_its_last_reading() -> None:
    # Prepare: one channel, readings 1..5; forecast the last 2 from the first 3.
    task = Forecast(horizon=2)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
    # Execute
    inputs, targets = task.targets(x, torch.tensor([-1]))  # the label is never read
    model = task.build_model((1, 5), num_outputs=99)
    naive = task.score(model(inputs), targets)
    # Assert: past - 3 and future - 3, then the window's standard deviation (sqrt 2: the
    # loss's unit); the untrained model is the naive forecast (MAE 1.5, loss 1.5 / sqrt 2).
    assert inputs.tolist() == [[[-2.0, -1.0, 0.0]]]
    assert targets[..., :2].tolist() == [[[1.0, 2.0]]]
    assert targets[..., 2].item() == pytest.approx(math.sqrt(2))
    assert naive.tolist() == [1.5]
    assert task.loss(model(inputs), targets).item() == pytest.approx(1.5 / math.sqrt(2))
    assert load_task(RunSettings(task="forecast", forecast_horizon=2)).metric == "mae"
    with pytest.raises(ValueError, match="longer than the horizon"):
        task.build_model((1, 2), 1)


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` with every weight drawn at random (a forecaster far from the naive one)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def test_a_forecast_is_scale_free_forecasting_ax_plus_b_gives_a_times_the_forecast_plus_b() -> None:
    # Prepare: a forecaster with random weights, and windows of 3 channels at unit scale
    task = Forecast(horizon=4)
    predictor = task.predictor(_trained_like(task.build_model((3, 24), 3), seed=1))
    windows = torch.randn(16, 3, 20, generator=torch.Generator().manual_seed(2))
    # Execute: the same windows in another sensor's units (x 1000, offset 5)
    with torch.no_grad():
        unit = predictor(windows)
        scaled = predictor(windows * 1000 + 5)
    # Assert: the forecast moves with the units; it is not the naive forecast
    torch.testing.assert_close(scaled, unit * 1000 + 5, rtol=1e-4, atol=1e-2)
    assert not torch.allclose(unit, windows[..., -1:].expand_as(unit), atol=1e-3)


def test_the_forecast_loss_is_scale_free_and_its_score_is_in_the_sensors_units() -> None:
    # Prepare: whole windows, and the same windows x 1000 + 5
    task = Forecast(horizon=4)
    model = _trained_like(task.build_model((2, 24), 2), seed=3)
    x = torch.randn(32, 2, 24, generator=torch.Generator().manual_seed(4))
    labels = torch.zeros(32, dtype=torch.long)
    # Execute
    with torch.no_grad():
        inputs, targets = task.targets(x, labels)
        big_inputs, big_targets = task.targets(x * 1000 + 5, labels)
        loss = task.loss(model(inputs), targets)
        big_loss = task.loss(model(big_inputs), big_targets)
        score = task.score(model(inputs), targets)
        big_score = task.score(model(big_inputs), big_targets)
    # Assert: the loss (what SGD steps follow) is the same; the MAE is 1000 times larger
    assert big_loss.item() == pytest.approx(loss.item(), rel=1e-4)
    torch.testing.assert_close(big_score, score * 1000, rtol=1e-4, atol=1e-3)


def test_a_constant_window_is_forecast_as_its_last_reading() -> None:
    # Prepare: a stuck sensor (every reading 1013), and a forecaster with random weights
    task = Forecast(horizon=2)
    predictor = task.predictor(_trained_like(task.build_model((1, 10), 1), seed=5))
    # Execute
    with torch.no_grad():
        forecast = predictor(torch.full((1, 1, 8), 1013.0))
    # Assert: finite, the reading itself (its spread is the floor: no change is forecast)
    assert torch.allclose(forecast, torch.full((1, 1, 2), 1013.0))


def test_series_windows_cut_every_stride() -> None:
    windows = series_windows(np.arange(10.0), length=4, stride=3)
    assert windows.shape == (3, 1, 4)  # (10 - 4) // 3 + 1
    assert windows[-1, 0].tolist() == [6.0, 7.0, 8.0, 9.0]
    assert series_windows(np.zeros((6, 2)), 6).shape == (1, 2, 6)
    with pytest.raises(ValueError, match="NaN"):
        series_windows(np.array([1.0, np.nan, 2.0]), 2)


def test_forecasting_learns_an_unlabelled_stream_better_than_repeating_the_last_reading(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: two sensors streaming a noisy oscillation (no labels: y is all zeros), and a
    # later stretch of it as the test set.
    rng = np.random.default_rng(0)
    t = np.arange(6000)
    series = np.sin(2 * np.pi * t / 25) + 0.1 * rng.normal(size=len(t))
    train, test = series_windows(series[:5000], 24), series_windows(series[5000:], 24)
    np.savez(tmp_path / "test.npz", x=test, y=np.zeros(len(test), np.int64))
    zeros = np.zeros(len(train) // 2, np.int64)
    devices = [
        VirtualDevice(f"dev-{k}", source=ArraySource(part, zeros, rng), rate=math.inf)
        for k, part in enumerate((train[: len(zeros)], train[len(zeros) : 2 * len(zeros)]))
    ]
    settings = fast(
        task="forecast", forecast_horizon=4, sample_shape="1,24", num_rounds=6, local_steps=20,
        lr=0.01, eval_data=str(tmp_path / "test.npz"), eval_samples=10_000,
    )  # fmt: skip
    grid = InProcessGrid(devices, tmp_path / "b", settings)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: MAE well below the naive forecast's, on the devices and on the test stretch.
    naive = float(np.abs(test[:, 0, 20:] - test[:, 0, 19:20]).mean())
    assert records[-1].metric == "mae"
    assert records[-1].test_accuracy < 0.7 * naive
    assert records[-1].accuracy < 0.8 * naive  # prequential: the model each round started from


def test_forecasting_an_accelerometer_in_raw_counts_beats_the_naive_forecast_at_the_demos_lr(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: a 3-axis accelerometer in milli-g counts (gravity about 1000 on one axis,
    # gait at about 1.9 Hz of a few hundred, noise; 64 Hz), its first 4 minutes split in
    # time across two devices, the next minute the test set; windows of 64 readings in and
    # 8 out, the learning rate the demo forecasts at.
    series = accelerometer_series(300, seed=1)
    cut = 240 * 64
    train, test = series_windows(series[:cut], 72), series_windows(series[cut:], 72)
    np.savez(tmp_path / "test.npz", x=test, y=np.zeros(len(test), np.int64))
    halves = np.array_split(np.arange(len(train)), 2)
    devices = [
        VirtualDevice(
            f"dev-{k}",
            source=ArraySource(train[h], np.zeros(len(h), np.int64), np.random.default_rng(k)),
            rate=math.inf,
        )
        for k, h in enumerate(halves)
    ]
    settings = fast(
        task="forecast", forecast_horizon=8, sample_shape="3,72", num_rounds=10,
        local_steps=20, global_batch=128, b_min=8, b_max=256, lr=FORECAST_LR,
        controller="fixed", availability_cap=False, eval_data=str(tmp_path / "test.npz"),
        eval_samples=len(test),
    )  # fmt: skip
    grid = InProcessGrid(devices, tmp_path / "b", settings)
    # Execute
    records = run_rounds(grid, settings)
    grid.close()
    # Assert: the test MAE, in milli-g, at most 0.9 x repeating the last reading's; every
    # round's score is finite (nothing diverged)
    naive = float(np.abs(test[:, :, 64:] - test[:, :, 63:64]).mean())
    assert naive > 50  # raw units: the scale the task must not depend on
    assert all(math.isfinite(r.test_accuracy) and r.diverged == 0 for r in records)
    assert records[-1].test_accuracy <= 0.9 * naive
    # summary.json keeps the held-out score's key, and names its metric
    summary = summarize(records, 0.0)
    assert (summary["metric"], summary["test_accuracy"]) == ("mae", records[-1].test_accuracy)


def test_classification_refuses_samples_of_a_label_free_stream_and_says_what_to_do() -> None:
    # Prepare: windows cut from a stream ingested without --label-field
    x = torch.zeros(4, 3, 8)
    y = torch.full((4,), NO_LABEL)
    # Execute / Assert
    with pytest.raises(ValueError, match="--label-field"):
        Classification().targets(x, y)
    past, future = Forecast(2).targets(x, y)  # forecasting never reads them
    assert past.shape == (4, 3, 6) and future.shape == (4, 3, 3)  # 2 ahead and the scale
