"""The round protocol's records: typed, written once through one kebab-case mapping,
versioned, and readable across versions."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from edge_client.wire import (
    DEVICE,
    METRICS,
    UPDATE,
    DeviceReply,
    MappingError,
    RecordError,
    ReplyMetrics,
    RoundPlan,
    from_mapping,
    kebab,
    to_mapping,
)
from edge_client.wire.codec import encode
from edge_client.wire.constants import RECORD_VERSION
from edge_client.wire.records import PACKED, model_layout, pack_model, unpack_model

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "edge_client" / "wire" / "records.py"
PLAIN_APP = ROOT / "deploy" / "bench" / "plain_flower"
NOOP_APP = ROOT / "deploy" / "bench" / "noop_flower"


def test_a_plan_travels_as_a_config_record_and_back() -> None:
    # Prepare
    plan = RoundPlan(
        batch_size=24, local_steps=7, lr=0.03, server_round=4, wait_policy="wait",
        compress="topk", compress_ratio=0.05, inject_publish=True, inject_beta=0.5,
    )  # fmt: skip
    # Execute
    record = plan.to_record()
    # Assert
    assert isinstance(record, ConfigRecord) and record["batch-size"] == 24
    assert record["format-version"] == RECORD_VERSION
    assert RoundPlan.from_record(record) == plan


def test_a_reply_travels_as_records_and_back() -> None:
    # Prepare
    metrics = ReplyMetrics(num_examples=80, batch_size=16, step_s=0.01, train_loss=1.2)
    reply = DeviceReply("pi-1", metrics, encode({"w": np.ones(3, np.float32)}))
    # Execute
    content = reply.to_content()
    # Assert: an unknown gap is left out, not sent as a sentinel
    assert isinstance(content.metric_records[METRICS], MetricRecord)
    assert "compress-gap" not in content.metric_records[METRICS]
    assert DeviceReply.from_content(content) == reply


def test_records_of_the_previous_release_are_read() -> None:
    # Prepare: a plan and a reply exactly as the release before format versions wrote them.
    old_plan: dict[str, Any] = {
        "server-round": 3, "batch-size": 20, "local-steps": 5, "lr": 0.05,
        "wait-policy": "adapt", "b-min": 4, "deadline-s": 60.0, "proximal-mu": 0.0,
        "compress": "none", "compress-ratio": 0.1, "inject-mix": 0.0,
        "inject-publish": False, "inject-beta": 0.25, "inject-budget": 0,
    }  # fmt: skip
    old_metrics: dict[str, Any] = {
        "num-examples": 100, "batch-size": 20, "local-steps": 5, "compute-s": 0.05,
        "step-s": 0.01, "wait-s": 0.0, "train-loss": 1.5, "stream-rate": 200.0,
        "buffer-fill": 900, "buffer-dropped": 0, "bytes-up": 1234, "inject-used": 0,
        "inject-opt-in": 0, "inject-bytes": 0, "inject-samples": 0,
    }  # fmt: skip
    frame = encode({"w": np.zeros(2, np.float32)})
    old_reply = RecordDict(
        {
            UPDATE: ConfigRecord({"frame": frame}),
            METRICS: MetricRecord(old_metrics),
            DEVICE: ConfigRecord({"device-id": "pi-1"}),
        }
    )
    # Execute
    plan = RoundPlan.from_record(ConfigRecord(old_plan))
    reply = DeviceReply.from_content(old_reply)
    # Assert
    assert (plan.server_round, plan.batch_size, plan.b_min) == (3, 20, 4)
    assert plan.format_version == 1
    assert reply.device_id == "pi-1" and reply.frame == frame
    assert reply.metrics.num_examples == 100 and reply.metrics.compress_gap is None


@pytest.mark.parametrize("version", [RECORD_VERSION + 1, float(RECORD_VERSION + 1)])
def test_a_record_of_a_newer_format_is_refused_not_misread(version: float) -> None:
    record = RoundPlan(8, 1, 0.1).to_record()
    record["format-version"] = version
    with pytest.raises(RecordError) as err:
        RoundPlan.from_record(record)
    assert err.value.reason == "newer-format" and "upgrade" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "detail"),
    [
        (lambda c: c.config_records[DEVICE].pop("device-id"), "lacks 'device-id'"),
        (lambda c: c.config_records[DEVICE].__setitem__("device-id", "a/b"), "device id"),
        (lambda c: c.metric_records[METRICS].pop("num-examples"), "num-examples"),
        (lambda c: c.metric_records[METRICS].__setitem__("batch-size", float("nan")), "batch-size"),
        (lambda c: c.config_records[UPDATE].__setitem__("frame", "text"), "bytes"),
        (lambda c: c.pop(METRICS), "record"),
    ],
)
def test_a_malformed_reply_is_refused_with_what_is_wrong(edit: object, detail: str) -> None:
    # Prepare
    metrics = ReplyMetrics(num_examples=8, batch_size=8, step_s=0.01, train_loss=1.0)
    content = DeviceReply("pi-1", metrics, b"frame").to_content()
    edit(content)  # type: ignore[operator]
    # Execute / Assert
    with pytest.raises(RecordError, match=detail) as err:
        DeviceReply.from_content(content)
    assert err.value.reason == "malformed"


@pytest.mark.parametrize(
    ("policy", "batch", "b_min", "steps", "waits_for"),
    [("wait", 16, 4, 10, 160), ("adapt", 16, 4, 10, 40), ("adapt", 2, 4, 10, 20)],
)
def test_the_wait_rule(policy: str, batch: int, b_min: int, steps: int, waits_for: int) -> None:
    # wait: the whole plan; adapt: the least worth a step, never more than the plan's batch
    plan = RoundPlan(batch, steps, 0.1, wait_policy=policy, b_min=b_min)
    assert plan.samples_to_wait_for() == waits_for


@dataclasses.dataclass
class Inner:
    hits: int


@dataclasses.dataclass
class Outer:
    batch_size: int
    rates: dict[str, float]
    inner: Inner
    tags: list[str] = dataclasses.field(default_factory=list)
    gap: float | None = None


def test_the_mapping_converts_types_and_names_the_key_at_fault() -> None:
    value = from_mapping(Outer, {"batch-size": "3", "rates": {"a": 1}, "inner": {"hits": 2.0}})
    assert value == Outer(3, {"a": 1.0}, Inner(2))
    assert to_mapping(value) == {
        "batch-size": 3,
        "rates": {"a": 1.0},
        "inner": {"hits": 2},
        "tags": [],
    }
    with pytest.raises(MappingError, match="batch-size") as err:
        from_mapping(Outer, {"batch-size": "many", "rates": {}, "inner": {"hits": 1}})
    assert err.value.key == "batch-size"
    with pytest.raises(MappingError, match="unknown keys"):
        from_mapping(
            Outer, {"batch-size": 1, "rates": {}, "inner": {"hits": 1}, "x": 1}, strict=True
        )


def test_no_metric_key_is_spelled_outside_the_records_module() -> None:
    # The reply's metric keys are written once, through the mapping, in the records module.
    keys = {kebab(f.name) for f in dataclasses.fields(ReplyMetrics)}
    spelled = []
    for package in ("edge_client", "aggregator", "deploy"):
        for path in (ROOT / package).rglob("*.py"):
            # the plain Flower apps the deployment benchmark compares with: no fedstream code
            if path == RECORDS or PLAIN_APP in path.parents or NOOP_APP in path.parents:
                continue
            tree = ast.parse(path.read_text())
            # kebab("lr") names a run-config field through the mapping: not a metric key
            through_mapping = {
                id(arg)
                for call in ast.walk(tree)
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "kebab"
                for arg in call.args
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and node.value in keys
                    and id(node) not in through_mapping
                ):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert spelled == []


def test_the_model_travels_as_one_array_and_is_cut_by_the_devices_own_model() -> None:
    # Prepare: a model of two tensors, in order
    model = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7.0, 8.0])}
    layout = model_layout(model)
    # Execute
    record = pack_model(model, np.float16)
    back = unpack_model(record, model, layout)
    # Assert: one array of 8 values (Flower moves each array as objects of its own), the
    # tensors back by name, float32
    assert list(record) == [PACKED] and record[PACKED].numpy().shape == (8,)
    assert record[PACKED].numpy().dtype == np.float16
    assert list(back) == ["w", "b"] and all(v.dtype == np.float32 for v in back.values())
    np.testing.assert_array_equal(back["w"], model["w"])
    np.testing.assert_array_equal(back["b"], model["b"])
    # tensors by name (no layout: a ServerApp of one's own) are read as they are
    by_name = unpack_model(ArrayRecord({k: Array(v) for k, v in model.items()}), model, "")
    np.testing.assert_array_equal(by_name["b"], model["b"])


@pytest.mark.parametrize(
    ("like", "layout", "message"),
    [
        ({"w": np.zeros((3, 2)), "b": np.zeros(2)}, None, "not this device's model"),
        ({"b": np.zeros(2), "w": np.zeros((2, 3))}, None, "not this device's model"),
        ({"w": np.zeros((2, 3)), "b": np.zeros(3)}, "same", "holds 8 values, this model 9"),
    ],
)
def test_a_packed_model_for_another_model_is_refused_saying_why(
    like: dict[str, np.ndarray], layout: str | None, message: str
) -> None:
    # Prepare: packed from a (2, 3) and a (2,) tensor
    record = pack_model({"w": np.zeros((2, 3)), "b": np.zeros(2)})
    sent = model_layout({"w": np.zeros((2, 3)), "b": np.zeros(2)})
    # Execute / Assert
    with pytest.raises(RecordError, match=message):
        unpack_model(record, like, model_layout(like) if layout == "same" else sent)
