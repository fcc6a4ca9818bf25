"""Training through the in-process runner: the real ServerApp loop and ClientApp, no network."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

from aggregator.checkpoint import RUN_CONFIG, Checkpoint, load_checkpoint, save_checkpoint
from aggregator.round_log import FORMAT_VERSION, RoundRecord, read_metrics, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.task.constants import DEFAULT_SHAPE
from edge_client.task.models import build_model
from edge_client.wire.run_config import RunSettings

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]


def step_time(b: int) -> float:
    """A virtual step cost: timings (and so the dynamic controller) are exact."""
    return 0.001 + 1e-5 * b


def test_run_trains_with_per_device_plans(tmp_path: Path, fast: Fast, fleet: Fleet) -> None:
    # Prepare
    grid = InProcessGrid(fleet(1, 1, 2, 4, rate=20_000), tmp_path / "buffers", step_time=step_time)
    settings = fast(num_rounds=6, local_steps=10, out_dir=str(tmp_path / "out"))
    # Execute
    every = run_rounds(grid, settings)
    records = rounds_only(every)
    # Assert: the timing probe's record first (round 0), then the rounds
    assert [r.round for r in every] == list(range(0, 7))
    assert all(r.sum_b == 64 for r in records)
    assert records[-1].accuracy > 1 / 6 + 0.15, [r.accuracy for r in records]  # above chance
    planned = records[-1].planned
    assert planned["dev-3"] < planned["dev-0"]  # the slowest device ends with a smaller batch
    assert read_metrics(tmp_path / "out" / "metrics.jsonl") == every
    assert set(records[-1].devices) == {f"dev-{i}" for i in range(4)}
    assert all(r.virtual_s > 0 for r in records)


def test_metrics_jsonl_holds_each_reply_as_the_device_reported_it(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    grid = InProcessGrid(fleet(1, 2), tmp_path / "buffers", step_time=step_time)
    # Execute
    run_rounds(grid, fast(num_rounds=1, out_dir=str(tmp_path / "out")))
    line = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    # Assert: the device entries carry the reply's own keys, nothing renamed on the way.
    entry = line["devices"]["dev-1"]
    assert {"num-examples", "batch-size", "step-s", "compute-s", "wait-s", "stream-rate"} <= set(
        entry
    )
    assert entry["step-s"] == pytest.approx(2 * step_time(entry["batch-size"]))  # slowdown 2
    assert {"sum-b", "lr-scale", "virtual-s", "bytes-up"} <= set(line)


#: A round as the release before format versions wrote it (device keys renamed on the way).
FORMAT_0_LINE = (
    '{"round": 1, "accuracy": 0.172, "loss": 1.79, "global-batch": 64, "sum-b": 64, '
    '"lr-scale": 1.0, "planned": {"dev-1": 32}, "devices": {"dev-1": {"planned-batch": 32, '
    '"batch": 32, "steps": 5, "num-examples": 160, "compute-s": 0.0198, "step-s": 0.00396, '
    '"wait-s": 0.0, "rate": 200.0, "fill": 1840, "dropped": 0, "bytes": 1576, "loss": 1.81, '
    '"gap": 0.165, "inject-used": 0, "inject-bytes": 0, "inject-samples": 0}}, "failed": {}, '
    '"rejected": {}, "rejected-reasons": {}, "compress": "topk", "aggregation": "fedavg", '
    '"aggregated": ["dev-1"], "bytes-up": 1576, "broadcast-bytes": 26136, '
    '"inject-picked": [], "inject-bytes": 0, "virtual-s": 0.021061, "wall-s": 1.187, '
    '"run-wall-s": 1.187}'
)


def test_a_metrics_file_resumed_across_an_upgrade_reads_as_one(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: round 1 written by the previous release, then a run appends round 2.
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text(FORMAT_0_LINE + "\n")
    grid = InProcessGrid(fleet(1), tmp_path / "buffers")
    run_rounds(grid, fast(num_rounds=1, out_dir=str(out)))
    # Execute
    old, new = rounds_only(read_metrics(out / "metrics.jsonl"))
    # Assert: the old line reads with today's names; a newer format is refused by name
    assert old.round == 1 and new.format_version == FORMAT_VERSION
    # Before prequential evaluation, a round's accuracy was the aggregator's own.
    assert old.test_accuracy == 0.172 and math.isnan(old.accuracy)
    metrics = old.devices["dev-1"]
    assert (metrics.batch_size, metrics.local_steps, metrics.bytes_up) == (32, 5, 1576)
    assert (metrics.stream_rate, metrics.buffer_fill, metrics.compress_gap) == (200.0, 1840, 0.165)
    newer = new.to_json().replace(f'"format-version": {FORMAT_VERSION}', '"format-version": 9')
    with pytest.raises(ValueError, match="format 9"):
        RoundRecord.from_json(newer)


def test_a_device_that_drops_out_is_left_out_and_the_run_goes_on(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    devices = fleet(1, 1, 1)
    devices[2].fail_rounds = {2, 3}
    grid = InProcessGrid(devices, tmp_path / "buffers")
    # Execute
    records = rounds_only(run_rounds(grid, fast(num_rounds=4)))
    # Assert
    assert set(records[1].devices) == {"dev-0", "dev-1"}
    assert records[1].failed == {"dev-2": 1}
    assert set(records[3].devices) == {"dev-0", "dev-1", "dev-2"}  # back, old state kept


def test_resume_continues_rounds_and_controller_state(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: run 2 rounds with checkpoints; the static controller keeps the split it
    # measured in round 1, so a resumed run that lost the state would plan another one.
    ckpt = str(tmp_path / "ckpt")
    settings = fast(num_rounds=2, checkpoint_dir=ckpt, controller="static")
    grid = InProcessGrid(fleet(1, 3), tmp_path / "buffers", step_time=step_time)
    first = rounds_only(run_rounds(grid, settings))
    saved = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    # Execute: the same run, 4 rounds, resumed.
    resumed = run_rounds(grid, replace(settings, num_rounds=4, resume=True))
    # Assert
    assert [r.round for r in first] == [1, 2] and [r.round for r in resumed] == [3, 4]
    assert saved["server-round"] == 2
    kept = {d: s["batch"] for d, s in saved["controller"]["devices"].items()}
    assert set(kept) == {"dev-0", "dev-1"} and kept["dev-1"] < kept["dev-0"]
    assert resumed[0].planned == first[-1].planned == kept


def test_a_resumed_run_ends_with_the_model_of_an_uninterrupted_one(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    grid = InProcessGrid(fleet(1, 3), tmp_path / "a", step_time=step_time)
    whole = rounds_only(run_rounds(grid, fast(num_rounds=4, checkpoint_dir=str(tmp_path / "ca"))))
    grid.close()
    # Execute: the aggregator dies after round 2; a new one (new grid, new strategy) resumes
    # on the same devices, whose buffers lived on.
    grid = InProcessGrid(fleet(1, 3), tmp_path / "b", step_time=step_time)
    run_rounds(grid, fast(num_rounds=2, checkpoint_dir=str(tmp_path / "cb")))
    grid.close()
    grid = InProcessGrid(fleet(1, 3), tmp_path / "b", step_time=step_time)
    rest = run_rounds(grid, fast(num_rounds=4, checkpoint_dir=str(tmp_path / "cb"), resume=True))
    grid.close()
    # Assert: same rounds, same plans (controller state carried over), the same final model,
    # and the fleet's counters carried on.
    assert [r.round for r in rest] == [3, 4]
    assert [r.planned for r in rest] == [r.planned for r in whole[2:]]
    assert rest[0].planned["dev-1"] < rest[0].planned["dev-0"]  # not a fresh equal split
    a = load_checkpoint(tmp_path / "ca")
    b = load_checkpoint(tmp_path / "cb")
    assert a is not None and b is not None and a.server_round == b.server_round == 4
    wa, wb = a.arrays.to_torch_state_dict(), b.arrays.to_torch_state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert rest[-1].accuracy == whole[-1].accuracy
    # The fleet registry carried on too (device map, counters; the last replies differ only
    # in buffer fills: the second grid streamed its initial samples into the buffers again).
    skip = (RUN_CONFIG, "last-metrics")
    fleet_a, fleet_b = ({k: v for k, v in c.extra.items() if k not in skip} for c in (a, b))
    assert fleet_a == fleet_b and set(a.extra["last-metrics"]) == set(b.extra["last-metrics"])


def test_resume_refuses_a_checkpoint_of_another_model(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare
    ckpt = str(tmp_path / "ckpt")
    grid = InProcessGrid(fleet(1), tmp_path / "buffers")
    run_rounds(grid, fast(num_rounds=1, checkpoint_dir=ckpt))
    # Execute / Assert
    with pytest.raises(ValueError, match=r"another configuration.*model: 'cnn' -> 'mlp'"):
        run_rounds(grid, fast(model="mlp", checkpoint_dir=ckpt, resume=True))
    grid.close()


def test_a_checkpoint_of_the_previous_release_resumes(tmp_path: Path, fast: Fast) -> None:
    # Prepare: state.json as the release before this layout wrote it: the controller's own
    # config inside its state, reply metrics as floats, no counters restored from it.
    ckpt = tmp_path / "ckpt"
    arrays = ArrayRecord(build_model("cnn", DEFAULT_SHAPE, 6).state_dict())
    metrics = {
        "num-examples": 80.0, "batch-size": 16.0, "local-steps": 5.0, "compute-s": 0.0174,
        "step-s": 0.00348, "wait-s": 0.0, "train-loss": 1.80, "stream-rate": 200.0,
        "buffer-fill": 1764.0, "buffer-dropped": 0.0, "bytes-up": 1724.0,
        "compress-gap": 0.19, "inject-used": 0.0, "inject-opt-in": 0.0, "inject-bytes": 0.0,
        "inject-samples": 0.0,
    }  # fmt: skip
    controller = {
        "config": {"global_batch": 64, "b_min": 4, "b_max": 64, "deadband": 0.1, "period": 1,
                   "mode": "dynamic", "smoothing": 0.5},
        "devices": {"dev-0": {"batch": 48, "history": [[32.0, 0.00132]],
                              "first_throughput": 24242.4}},
        "updates": 1,
    }  # fmt: skip
    extra = {
        "node-devices": {"100": "dev-0"},
        "retired-nodes": [],
        "last-metrics": {"dev-0": metrics},
        "run-config": {"num-rounds": 2},
    }
    save_checkpoint(ckpt, Checkpoint(1, arrays, controller, extra))
    grid = InProcessGrid([VirtualDevice("dev-0")], tmp_path / "buffers")
    # Execute
    rest = run_rounds(grid, fast(num_rounds=2, checkpoint_dir=str(ckpt), resume=True))
    grid.close()
    # Assert: round 2 ran for the device known from the checkpoint, capped by its last fill.
    assert [r.round for r in rest] == [2] and set(rest[0].devices) == {"dev-0"}


def test_starved_streams_cap_batches_and_scale_the_learning_rate(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: two devices whose streams deliver far less than the plan asks (ScaDLES cap).
    settings = fast(num_rounds=5, wait_policy="adapt")
    grid = InProcessGrid(fleet(1, 1, rate=50, initial=100), tmp_path / "buffers")
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    # Assert: from round 2 on, no device is asked for more than its buffer held after the
    # last round plus what its stream brings in a round as long, over the K steps (b_min
    # aside); the learning rate follows the plan's total and each device's actual batch.
    k = settings.local_steps
    for prev, now in itertools.pairwise(records):
        assert now.sum_b < settings.global_batch
        assert now.lr_scale == pytest.approx(now.sum_b / settings.global_batch)
        for d, b in now.planned.items():
            can = prev.devices[d].buffer_fill + 50 * prev.virtual_s
            assert b * k <= max(can, settings.b_min * k), (now.round, d)
        for d, m in now.devices.items():
            share = m.batch_size / now.planned[d]
            assert m.lr == pytest.approx(settings.lr * now.lr_scale * share)
        assert now.sum_trained <= now.sum_b


def test_wait_policy_waits_for_the_full_batch_and_adapt_does_not(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: streams slower than the plan: "wait" blocks (on the virtual clock) for b*K
    # samples, "adapt" trains on what is there. Steps cost the module's virtual step time:
    # with measured ones a loaded machine's slow probe round let the streams fill the
    # buffers before round 1, which then waited for nothing.
    waiting = InProcessGrid(fleet(1, 1, rate=400, initial=0), tmp_path / "w", step_time=step_time)
    adapting = InProcessGrid(fleet(1, 1, rate=400, initial=0), tmp_path / "a", step_time=step_time)
    base = fast(num_rounds=2)
    # Execute
    waited = rounds_only(run_rounds(waiting, replace(base, wait_policy="wait")))
    adapted = rounds_only(run_rounds(adapting, replace(base, wait_policy="adapt")))
    # Assert
    first_wait, first_adapt = waited[0], adapted[0]
    for dev, m in first_wait.devices.items():  # empty buffers: a real wait, then the full batch
        assert m.wait_s > 0 and m.batch_size == first_wait.planned[dev]
    assert sum(m.wait_s for m in first_adapt.devices.values()) < sum(
        m.wait_s for m in first_wait.devices.values()
    )
    assert any(m.batch_size < first_adapt.planned[d] for d, m in first_adapt.devices.items())


def test_a_checkpoint_interrupted_mid_write_leaves_the_previous_one(tmp_path: Path) -> None:
    # Prepare: a checkpoint for round 1, then a crash after round 2's model file was written.
    ckpt = tmp_path / "ckpt"
    arrays = ArrayRecord({"w": torch.tensor([1.0])})
    save_checkpoint(ckpt, Checkpoint(1, arrays, {"devices": {}}, {}))
    (ckpt / "model-2.pt").write_bytes(b"half written")
    # Execute
    loaded = load_checkpoint(ckpt)
    # Assert
    assert loaded is not None and loaded.server_round == 1
    torch.testing.assert_close(loaded.arrays.to_torch_state_dict()["w"], torch.tensor([1.0]))


def test_the_first_round_follows_the_speeds_a_probe_measured(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a device 4x slower than the other, steps that cost mostly per sample; the same
    # run with and without the probe.
    def per_sample(b: int) -> float:
        return 1e-4 + 1e-4 * b

    settings = fast(num_rounds=1, global_batch=64, b_max=64)
    probed = InProcessGrid(fleet(1, 4), tmp_path / "a", step_time=per_sample)
    blind = InProcessGrid(fleet(1, 4), tmp_path / "b", step_time=per_sample)
    # Execute
    probe, first = run_rounds(probed, settings)
    equal = run_rounds(blind, replace(settings, controller_probe=0))[0]
    # Assert: without timings B is split equally; with the probe the slow device gets the
    # share its speed earns (step times within 10 %), and the probe's steps cost virtual time.
    assert equal.planned == {"dev-0": 32, "dev-1": 32}
    b0, b1 = first.planned["dev-0"], first.planned["dev-1"]
    assert b0 + b1 == 64 and b1 < b0
    assert per_sample(b1) * 4 / per_sample(b0) == pytest.approx(1.0, abs=0.1)
    assert probe.round == 0 and probe.virtual_s > 0
    assert probed.clock == pytest.approx(probe.virtual_s + first.virtual_s, rel=1e-4)
    probed.close()
    blind.close()


def test_without_a_probe_the_second_round_follows_the_speeds_round_one_timed(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a device 4x slower than the other, steps with a fixed cost as large as 10
    # samples' (so one timing, read as a proportional law, would misplan); no probe.
    def affine(b: int) -> float:
        return 1e-3 + 1e-4 * b

    settings = fast(
        num_rounds=2,
        global_batch=64,
        b_max=64,
        controller_probe=0,
        local_steps=6,
        out_dir=str(tmp_path / "out"),
    )
    grid = InProcessGrid(fleet(1, 4), tmp_path / "buffers", step_time=affine)
    # Execute
    first, second = run_rounds(grid, settings)
    # Assert: round 1 splits B equally and each device times two step sizes around its
    # batch; round 2's plan then gives both devices the same step time (within 5 %)
    assert first.planned == {"dev-0": 32, "dev-1": 32}
    line = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["devices"]["dev-1"]["step-batches"] == [16, 48]
    b0, b1 = second.planned["dev-0"], second.planned["dev-1"]
    assert b0 + b1 == 64 and b1 < b0
    assert affine(b1) * 4 / affine(b0) == pytest.approx(1.0, abs=0.05)
    grid.close()
