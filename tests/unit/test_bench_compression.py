"""The compression benchmark's accounting (traffic both ways, bytes to a target, the broadcast
on the virtual clock), a short run of the scenario end to end, and ScaDLES' adaptive rule
deciding by majority in a real run."""

from __future__ import annotations

import pytest

from aggregator.round_log import RoundRecord
from deploy.bench import compression
from deploy.bench.compression import (
    ModelCase,
    bytes_to_target,
    per_device_traffic,
)
from edge_client.wire.records import ReplyMetrics
from tests.helpers import round_record


def record(
    round_: int, accuracy: float, up: dict[str, int], planned: list[str], down: int = 100
) -> RoundRecord:
    """A round in which ``planned`` devices were sent ``down`` bytes of model and the devices
    of ``up`` replied with frames of those sizes; 1 virtual second."""
    devices = {d: ReplyMetrics(num_examples=1, batch_size=1, step_s=0.0, train_loss=0.0,
                               bytes_up=n) for d, n in up.items()}  # fmt: skip
    return round_record(
        round=round_, accuracy=0.0, test_accuracy=accuracy, loss=0.0, global_batch=2, sum_b=2,
        planned={d: 1 for d in planned}, devices=devices, aggregated=list(up),
        bytes_up=sum(up.values()), broadcast_bytes=down, virtual_s=1.0,
    )  # fmt: skip


def test_each_device_gets_the_model_down_every_round_it_is_sent_the_plan() -> None:
    # Prepare: b is sent the plan in round 2 but its reply never comes.
    records = [
        record(1, 0.5, {"a": 10, "b": 20}, ["a", "b"]),
        record(2, 0.6, {"a": 12}, ["a", "b"]),
        record(3, 0.7, {"a": 14, "b": 24}, ["a", "b"], down=50),
    ]
    # Execute
    traffic = per_device_traffic(records)
    # Assert: up counts the frames received; down every copy sent, answered or not.
    assert traffic == {"a": {"up": 36, "down": 250}, "b": {"up": 44, "down": 250}}


def test_bytes_to_target_stop_at_the_first_round_of_the_two_that_hold_it() -> None:
    # Prepare: 0.9 is touched in round 2, lost, then held from round 4.
    accuracies = (0.5, 0.91, 0.7, 0.9, 0.95)
    records = [record(i, a, {"a": 10 * i}, ["a", "b"]) for i, a in enumerate(accuracies, 1)]
    # Execute
    up, down = bytes_to_target(records, 0.9)
    # Assert: rounds 1-4: frames 10+20+30+40 up, the model to two devices 4 times down.
    assert (up, down) == (100, 800)
    assert bytes_to_target(records, 0.99) == (None, None)


def test_a_short_run_of_the_scenario_reports_traffic_both_ways_per_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: two tiny model cases of two modes, 2 rounds x 2 steps; no 1M-value timing.
    tiny = ModelCase("cnn", "cnn", 0, 2, 2, ("none", "topk-1%"), ("none", "topk-1%"))
    wide = ModelCase("cnn-64", "cnn", 64, 2, 2, ("none", "int8+fp16-down"), ("none",))
    monkeypatch.setattr(compression, "MODELS", (tiny, wide))
    monkeypatch.setattr(compression, "LOCAL_STEPS", 2)
    monkeypatch.setattr(compression, "EVAL_SAMPLES", 200)
    fake_speed: dict[str, float] = {"encode_mbps": 200, "decode_mbps": 400, "roundtrip_mbps": 130}
    monkeypatch.setattr(compression, "codec_speed", lambda mode, ratio: fake_speed)
    # Execute
    result = compression.run(seeds=(0, 1))
    # Assert
    entries = {(e["model"], e["mode"]): e for e in result.entries}
    assert set(entries) == {
        ("cnn", "none"), ("cnn", "topk-1%"), ("cnn-64", "none"), ("cnn-64", "int8+fp16-down")
    }  # fmt: skip
    none, topk = entries[("cnn", "none")], entries[("cnn", "topk-1%")]
    assert none["ratio"] == 1.0 and none["accuracy_delta_per_seed"] == [0.0, 0.0]
    assert topk["bytes_up"] < none["bytes_up"] / 5 and topk["topk_rounds"] == 2
    assert len(topk["bytes_up_per_seed"]) == 2
    # The model goes down to each of the 4 devices every round, as broadcast.
    assert none["down_per_device_round"] == none["bytes_down"] / 8
    assert set(none["per_device_first_seed"]) == {"dev-0", "dev-1", "dev-2", "dev-3"}
    wide_none, half = entries[("cnn-64", "none")], entries[("cnn-64", "int8+fp16-down")]
    assert half["down_per_device_round"] < 0.6 * wide_none["down_per_device_round"]
    assert wide_none["parameters"] > none["parameters"]
    assert [m["parameters"] for m in result.meta["models"]] == [
        none["parameters"],
        wide_none["parameters"],
    ]
    # Each coding's speed once, in the order first used; every figure names seeds and clock.
    assert [(s["codec"], s["compress_ratio"]) for s in result.meta["codec_speed"]] == [
        ("none", None), ("topk", 0.01), ("int8", None)
    ]  # fmt: skip
    assert "Seeds 0, 1" in result.table and "virtual clock" in result.table
    assert "wall clock" in result.table
