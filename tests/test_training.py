"""Training through the in-process runner: the real ServerApp loop and ClientApp, no network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from aggregator.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from aggregator.controller import BatchController
from aggregator.server_app import run_rounds
from aggregator.settings import RunSettings
from aggregator.strategy import StreamStrategy
from bench.probes import nan_frame
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.codec import encode
from edge_client.protocol import DEVICE, FRAME, METRICS, UPDATE

FAST: dict[str, Any] = {
    "num_rounds": 3,
    "local_steps": 5,
    "global_batch": 64,
    "b_min": 4,
    "b_max": 64,
    "eval_samples": 500,
}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def fleet(*slowdowns: float, **kw: Any) -> list[VirtualDevice]:
    return [VirtualDevice(f"dev-{i}", slowdown=s, **kw) for i, s in enumerate(slowdowns)]


def reply(
    node: int, device: str, weights: dict[str, torch.Tensor], used: int, frame: bytes = b""
) -> Message:
    ask = Message(RecordDict({}), node, MessageType.TRAIN, group_id="1")
    ask.metadata.__dict__["_message_id"] = f"m{node}"
    metrics: dict[str, int | float | list[int] | list[float]] = {
        "num-examples": used,
        "batch-size": used,
        "step-s": 0.01,
        "train-loss": 1.0,
        "local-steps": 1,
        "compute-s": 0.01,
        "wait-s": 0.0,
    }
    content = RecordDict(
        {
            UPDATE: ConfigRecord(
                {FRAME: frame or encode({k: w.numpy() for k, w in weights.items()})}
            ),
            METRICS: MetricRecord(metrics),
            DEVICE: ConfigRecord({"device-id": device}),
        }
    )
    return Message(content, reply_to=ask)


def test_aggregate_is_the_sample_weighted_average(tmp_path: Path) -> None:
    # Prepare: three replies, one with NaN (must be left out), on a 2-tensor "model".
    InProcessGrid([], tmp_path)  # sets Flower's task identity for building messages
    settings = RunSettings(**FAST)
    strategy = StreamStrategy(
        settings=settings, controller=BatchController(settings.controller_config())
    )
    strategy._global = {"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}
    strategy._shapes = {"w": (2,), "b": (1,)}
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([4.0, 8.0]), "b": torch.tensor([3.0])}
    bad = nan_frame({"w": np.ones(2, np.float32), "b": np.zeros(1, np.float32)})
    # Execute
    agg, summary = strategy.aggregate_train(
        1, [reply(1, "x", a, 10), reply(2, "y", b, 30), reply(3, "z", a, 60, bad)]
    )
    # Assert: (10*a + 30*b) / 40
    assert agg is not None and summary is not None
    got = agg.to_torch_state_dict()
    torch.testing.assert_close(got["w"], torch.tensor([3.25, 6.5]))
    torch.testing.assert_close(got["b"], torch.tensor([2.25]))
    assert summary["num-examples"] == 40
    assert strategy.rejected == {"z": 1} and strategy.rejected_reasons == {"non-finite": 1}


def test_run_trains_with_per_device_plans(tmp_path: Path) -> None:
    # Prepare
    grid = InProcessGrid(fleet(1, 1, 2, 4, rate=20_000), tmp_path / "buffers")
    settings = RunSettings(
        **{**FAST, "num_rounds": 6, "local_steps": 10}, out_dir=str(tmp_path / "out")
    )
    # Execute
    records = run_rounds(grid, settings)
    # Assert
    assert [r["round"] for r in records] == list(range(1, 7))
    assert all(r["sum-b"] == 64 for r in records)
    assert records[-1]["accuracy"] > 1 / 6 + 0.15  # well above chance after 6 short rounds
    planned = records[-1]["planned"]
    assert planned["dev-3"] < planned["dev-0"]  # the slowest device ends with a smaller batch
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 and set(json.loads(lines[-1])["devices"]) == {
        f"dev-{i}" for i in range(4)
    }
    assert all(r["virtual-s"] > 0 for r in records)


def test_a_device_that_drops_out_is_left_out_and_the_run_goes_on(tmp_path: Path) -> None:
    devices = fleet(1, 1, 1)
    devices[2].fail_rounds = {2, 3}
    grid = InProcessGrid(devices, tmp_path / "buffers")

    records = run_rounds(grid, RunSettings(**{**FAST, "num_rounds": 4}))

    assert set(records[1]["devices"]) == {"dev-0", "dev-1"}
    assert records[1]["failed"] == {"dev-2": 1}
    assert set(records[3]["devices"]) == {"dev-0", "dev-1", "dev-2"}  # back, old state kept


def test_a_device_back_on_a_new_node_retires_its_old_node(tmp_path: Path) -> None:
    # Prepare: dev-0 was on node 100; it comes back on node 103 (SuperNode restart) while
    # the SuperLink still lists the dead node.
    grid = InProcessGrid(fleet(1, 1, 1), tmp_path)
    settings = RunSettings(**FAST)
    strategy = StreamStrategy(
        settings=settings, controller=BatchController(settings.controller_config())
    )
    strategy.node_devices = {100: "dev-0", 101: "dev-1", 102: "dev-2"}
    arrays = ArrayRecord({"w": torch.zeros(2)})
    # Execute
    strategy._learn_device(103, "dev-0")
    grid.devices[103] = VirtualDevice("dev-0")
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    grid.close()
    # Assert: the dead node gets no message (no round timeout spent on it)
    assert sorted(m.metadata.dst_node_id for m in messages) == [101, 102, 103]
    assert strategy.retired == {100} and strategy.node_devices[103] == "dev-0"


def test_resume_continues_rounds_and_controller_state(tmp_path: Path) -> None:
    # Prepare: run 2 rounds with checkpoints.
    ckpt = str(tmp_path / "ckpt")
    grid = InProcessGrid(fleet(1, 3), tmp_path / "buffers")
    first = run_rounds(grid, RunSettings(**{**FAST, "num_rounds": 2}, checkpoint_dir=ckpt))
    saved = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    # Execute: the same run, 4 rounds, resumed.
    resumed = run_rounds(
        grid, RunSettings(**{**FAST, "num_rounds": 4}, checkpoint_dir=ckpt, resume=True)
    )
    # Assert
    assert [r["round"] for r in first] == [1, 2] and [r["round"] for r in resumed] == [3, 4]
    assert saved["server-round"] == 2
    assert set(saved["controller"]["devices"]) == {"dev-0", "dev-1"}
    assert (
        resumed[0]["planned"] == {d: s["batch"] for d, s in saved["controller"]["devices"].items()}
        or resumed[0]["sum-b"] == 64
    )


def test_a_resumed_run_ends_with_the_model_of_an_uninterrupted_one(tmp_path: Path) -> None:
    # Prepare: the virtual step cost makes timings (and so the dynamic controller) exact.
    def step_time(b: int) -> float:
        return 0.001 + 1e-5 * b

    settings = {**FAST, "num_rounds": 4}
    grid = InProcessGrid(fleet(1, 3), tmp_path / "a", step_time=step_time)
    whole = run_rounds(grid, RunSettings(**settings, checkpoint_dir=str(tmp_path / "ca")))
    grid.close()
    # Execute: the aggregator dies after round 2; a new one (new grid, new strategy) resumes
    # on the same devices, whose buffers lived on.
    grid = InProcessGrid(fleet(1, 3), tmp_path / "b", step_time=step_time)
    run_rounds(
        grid, RunSettings(**{**settings, "num_rounds": 2}, checkpoint_dir=str(tmp_path / "cb"))
    )
    grid.close()
    grid = InProcessGrid(fleet(1, 3), tmp_path / "b", step_time=step_time)
    rest = run_rounds(
        grid, RunSettings(**settings, checkpoint_dir=str(tmp_path / "cb"), resume=True)
    )
    grid.close()
    # Assert: same rounds, same plans (controller state carried over), the same final model.
    assert [r["round"] for r in rest] == [3, 4]
    assert [r["planned"] for r in rest] == [r["planned"] for r in whole[2:]]
    assert rest[0]["planned"]["dev-1"] < rest[0]["planned"]["dev-0"]  # not a fresh equal split
    a = load_checkpoint(tmp_path / "ca")
    b = load_checkpoint(tmp_path / "cb")
    assert a is not None and b is not None and a.server_round == b.server_round == 4
    wa, wb = a.arrays.to_torch_state_dict(), b.arrays.to_torch_state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert rest[-1]["accuracy"] == whole[-1]["accuracy"]


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    # Prepare
    ckpt = str(tmp_path / "ckpt")
    grid = InProcessGrid(fleet(1), tmp_path / "buffers")
    run_rounds(grid, RunSettings(**{**FAST, "num_rounds": 1}, checkpoint_dir=ckpt))
    # Execute / Assert
    with pytest.raises(ValueError, match=r"another configuration.*model: 'cnn' -> 'mlp'"):
        run_rounds(grid, RunSettings(**FAST, model="mlp", checkpoint_dir=ckpt, resume=True))
    grid.close()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"b-min": 64, "b-max": 32}, "must not exceed b-max"),
        ({"controller": "pid"}, "controller must be one of"),
        ({"lr": -1}, "lr must be > 0"),
        ({"wait-policy": "sleep"}, "wait-policy"),
        ({"model": "resnet"}, "model must be one of"),
        ({"num-rounds": "many"}, "num-rounds"),
        ({"round-timout": 5}, "unknown run-config keys"),
    ],
)
def test_bad_run_config_fails_fast(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSettings.from_run_config(config)


def test_run_config_is_read_with_types() -> None:
    s = RunSettings.from_run_config({"num-rounds": 3, "lr": "0.1", "resume": "true"})
    assert (s.num_rounds, s.lr, s.resume) == (3, 0.1, True)
    assert np.isclose(s.lr, 0.1)


def test_starved_streams_cap_batches_and_scale_the_learning_rate(tmp_path: Path) -> None:
    # Two devices whose streams deliver far less than the plan asks for (ScaDLES cap).
    grid = InProcessGrid(fleet(1, 1, rate=50, initial=100), tmp_path / "buffers")

    records = run_rounds(grid, RunSettings(**{**FAST, "num_rounds": 3}))

    assert records[-1]["sum-b"] < 64 and records[-1]["lr-scale"] < 1.0
    assert all(d["batch"] <= d["planned-batch"] for d in records[-1]["devices"].values())


def test_pyproject_run_config_is_complete_and_matches_the_defaults() -> None:
    import tomllib

    config = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert RunSettings.from_run_config(config) == RunSettings()


def test_wait_policy_waits_for_the_full_batch_and_adapt_does_not(tmp_path: Path) -> None:
    # Streams slower than the plan: "wait" blocks (on the virtual clock) for b*K samples,
    # "adapt" trains on what is there.
    waiting = InProcessGrid(fleet(1, 1, rate=400, initial=0), tmp_path / "w")
    adapting = InProcessGrid(fleet(1, 1, rate=400, initial=0), tmp_path / "a")
    base = {**FAST, "num_rounds": 2}

    waited = run_rounds(waiting, RunSettings(**base, wait_policy="wait"))
    adapted = run_rounds(adapting, RunSettings(**base, wait_policy="adapt"))

    first_wait, first_adapt = waited[0]["devices"].values(), adapted[0]["devices"].values()
    for dev in first_wait:  # empty buffers at the start: a real wait, then the full batch
        assert dev["wait-s"] > 0 and dev["batch"] == dev["planned-batch"]
    assert sum(d["wait-s"] for d in first_adapt) < sum(d["wait-s"] for d in first_wait)
    assert any(d["batch"] < d["planned-batch"] for d in first_adapt)


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
