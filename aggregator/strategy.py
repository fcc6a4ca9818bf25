"""The fedstream strategy: per-device plans out, validated and weighted updates in.

Built on Flower's ``flwr.serverapp.strategy.Strategy``. Unlike ``FedAvg`` it

* gives each device its own plan (a fresh ``ConfigRecord`` per message: Flower would
  otherwise share one object between all messages),
* keys everything by ``device-id`` (Flower's node ids change when a SuperNode restarts),
* weights the average by the samples each device actually used (``num-examples``),
* receives each update as a codec frame (a delta against the round's global model),
  picks the round's compression (ScaDLES' adaptive rule when asked), and sends the
  model down as float32 or float16,
* leaves out replies that are errors, malformed, corrupt, of the wrong shapes or
  non-finite, and counts them per device and per reason,
* aggregates as it reads (one running sum): memory is O(model), not O(devices x model).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from aggregator.controller import BatchController, Plan
from aggregator.robust import robust_aggregate
from aggregator.settings import RunSettings
from edge_client.codec import CodecError, choose_mode, decode, raw_size_limit
from edge_client.protocol import ARRAYS, CONFIG, DEVICE, FRAME, METRICS, UPDATE, plan_to_config
from edge_client.trainer import LocalPlan

__all__ = ["DeviceReport", "StreamStrategy"]

INJECT_STREAM = 77  # seed stream of the injector draw


@dataclass
class DeviceReport:
    """One device's reply in one round (the per-device part of the metrics JSONL)."""

    device_id: str
    node_id: int
    metrics: dict[str, float]
    planned_batch: int


@dataclass
class StreamStrategy(Strategy):
    """Per-device batch plans (OmniLearn/ScaDLES) and sample-weighted aggregation (or a
    Byzantine-robust rule, ``aggregation`` in the run config: :mod:`aggregator.robust`).

    Parameters
    ----------
    settings : RunSettings
        The run's tunables.
    controller : BatchController
        Batch sizes per device id (restored from a checkpoint on resume).
    """

    settings: RunSettings
    controller: BatchController
    node_devices: dict[int, str] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)  # nodes whose device came back elsewhere
    last_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    rejected_reasons: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    # Set by configure_train / aggregate_train for the round just run.
    plan: Plan = field(default_factory=lambda: Plan({}))
    mode: str = "none"  # the round's update compression
    injectors: list[str] = field(default_factory=list)  # devices asked to share this round
    broadcast_bytes: int = 0  # one copy of the model as sent down
    reports: list[DeviceReport] = field(default_factory=list)
    aggregated: list[str] = field(default_factory=list)  # devices whose update went in
    round_s: float = 0.0
    _shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _global: dict[str, np.ndarray] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # message id -> node, this round
    planned: dict[int, int] = field(default_factory=dict)  # node -> planned batch, this round

    # -- training ---------------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per node with this device's plan (batch, steps, scaled lr, codec)."""
        self._global = {k: a.numpy().astype(np.float32) for k, a in arrays.items()}
        self._shapes = {k: v.shape for k, v in self._global.items()}
        # A node whose device reappeared on another node is dead (its SuperLink entry lingers
        # for about a minute): planning for it would cost every round a timeout.
        nodes = sorted(n for n in grid.get_node_ids() if n not in self.retired)
        ids = {n: self.node_devices.get(n, f"node-{n}") for n in nodes}
        self.plan = self.controller.plan(list(ids.values()), server_round, self._available())
        self.mode = self._round_mode(list(ids.values()))
        self.injectors = self._pick_injectors(server_round, list(ids.values()))
        down = self._broadcast(arrays)
        injecting = self.settings.inject_alpha > 0
        self.planned = {node: self.plan.batches[device] for node, device in ids.items()}
        messages = []
        for node, device in ids.items():
            local = LocalPlan(
                batch_size=self.plan.batches[device],
                local_steps=self.settings.local_steps,
                lr=self.settings.lr * self.plan.lr_scale,
                wait_policy=self.settings.wait_policy,
                b_min=self.settings.b_min,
                deadline_s=self.settings.round_timeout / 2,
                compress=self.mode,
                compress_ratio=self.settings.compress_ratio,
                proximal_mu=self.settings.proximal_mu,
                inject_mix=self.settings.inject_mix if injecting else 0.0,
                inject_publish=device in self.injectors,
                inject_beta=self.settings.inject_beta,
                inject_budget=self.settings.inject_budget // max(1, len(self.injectors)),
            )
            cfg = plan_to_config(local, server_round)  # a fresh record per message
            for key, value in config.items():
                cfg[key] = value
            content = RecordDict({ARRAYS: down, CONFIG: cfg})
            messages.append(Message(content, node, MessageType.TRAIN, group_id=str(server_round)))
        return messages

    def _round_mode(self, devices: list[str]) -> str:
        """The run's mode, or for ``adaptive`` ScaDLES' rule over the devices' gap EWMAs."""
        if self.settings.compress != "adaptive":
            return self.settings.compress
        gaps = [
            self.last_metrics[d]["compress-gap"]
            for d in devices
            if "compress-gap" in self.last_metrics.get(d, {})
        ]
        return choose_mode(gaps, self.settings.compress_delta)

    def _pick_injectors(self, server_round: int, devices: list[str]) -> list[str]:
        """ScaDLES: a random fraction alpha of the devices that reported opting in."""
        opted = sorted(
            d for d in devices if self.last_metrics.get(d, {}).get("inject-opt-in", 0) >= 1
        )
        if self.settings.inject_alpha <= 0 or not opted:
            return []
        n = max(1, round(self.settings.inject_alpha * len(opted)))
        rng = np.random.default_rng([self.settings.seed, server_round, INJECT_STREAM])
        return sorted(str(d) for d in rng.choice(opted, size=n, replace=False))

    def _broadcast(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model as sent down: float32, or float16 when the broadcast is compressed."""
        if self.settings.compress_broadcast == "fp16":
            arrays = ArrayRecord({k: Array(a.astype(np.float16)) for k, a in self._global.items()})
        self.broadcast_bytes = sum(len(a.data) for a in arrays.values())
        return arrays

    def _available(self) -> dict[str, float]:
        """ScaDLES cap: what each device can have by the end of the round (none when the
        run asks for conventional, stream-blind batches)."""
        if not self.settings.availability_cap:
            return {}
        horizon = self.round_s or self.settings.round_timeout / 2
        return {
            d: m["buffer-fill"] + m["stream-rate"] * horizon for d, m in self.last_metrics.items()
        }

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Add the valid deltas to the global model, weighted by samples used.

        Each frame is decoded and added to one running sum before the next is read.
        """
        self.reports = []
        acc = {k: np.zeros(v.shape, np.float64) for k, v in self._global.items()}
        robust = self.settings.aggregation != "fedavg"
        kept: list[tuple[dict[str, np.ndarray], int, str]] = []  # robust rules need them all
        total = 0
        loss = 0.0
        cap = raw_size_limit(self._shapes)
        # Error replies come from the SuperLink (src node 1): find the node by message id.
        sent = self.sent
        answered: set[str] = set()
        for msg in replies:  # may be a generator: each reply is dropped once added in
            answered.add(msg.metadata.reply_to_message_id)
            node = sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if msg.has_error():
                self.failed[self.node_devices.get(node, f"node-{node}")] += 1
                continue
            try:
                device, metrics, frame = _unpack(msg)
            except ValueError:
                self._reject(self.node_devices.get(node, f"node-{node}"), "malformed")
                continue
            self._learn_device(node, device)
            try:
                delta = decode(frame, self._shapes, cap)
            except CodecError as err:
                self._reject(device, err.reason)
                continue
            metrics["bytes-up"] = float(len(frame))  # as received, not as claimed
            self.last_metrics[device] = metrics
            self.reports.append(DeviceReport(device, node, metrics, self.planned.get(node, 0)))
            used = int(metrics["num-examples"])
            if used > 0:
                if robust:
                    kept.append((delta, used, device))
                else:
                    for k, d in delta.items():
                        acc[k] += used * d.astype(np.float64)
                total += used
                loss += metrics["train-loss"] * used
                self.controller.observe(device, int(metrics["batch-size"]), metrics["step-s"])
        for mid, node in sent.items():  # no reply before the round timeout
            if mid not in answered:
                self.failed[self.node_devices.get(node, f"node-{node}")] += 1
        if total == 0:
            return None, None
        if robust:
            step, picked = robust_aggregate(
                self.settings.aggregation,
                [d for d, _, _ in kept],
                [n for _, n, _ in kept],
                self.settings.trim_fraction,
                self.settings.krum_malicious,
            )
            self.aggregated = [kept[i][2] for i in picked]
        else:
            step = {k: a / total for k, a in acc.items()}
            self.aggregated = [r.device_id for r in self.reports if r.metrics["num-examples"] > 0]
        new = {k: (g + step[k]).astype(np.float32) for k, g in self._global.items()}
        summary = MetricRecord({"train-loss": loss / total, "num-examples": total})
        return ArrayRecord({k: Array(v) for k, v in new.items()}), summary

    def _reject(self, device: str, reason: str) -> None:
        self.rejected[device] += 1
        self.rejected_reasons[reason] += 1

    def _learn_device(self, node: int, device: str) -> None:
        """Map node -> device id; a device on a new node (restart) keeps its state."""
        if self.node_devices.get(node) == device:
            return  # the usual case: known (and no scan over the fleet per reply)
        for old, dev in list(self.node_devices.items()):
            if dev == device and old != node:
                del self.node_devices[old]
                self.retired.add(old)
        if self.node_devices.get(node) != device:
            placeholder = f"node-{node}"
            self.controller.devices.pop(placeholder, None)
            self.node_devices[node] = device

    # -- evaluation is server-side (held-out stream) ----------------------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No client-side evaluation: the aggregator evaluates on a held-out stream."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    def summary(self) -> None:
        """Flower's start-of-run log hook."""

    def state_dict(self) -> dict[str, Any]:
        """Device bookkeeping for the checkpoint."""
        return {
            "node-devices": {str(n): d for n, d in self.node_devices.items()},
            "retired-nodes": sorted(self.retired),
            "last-metrics": self.last_metrics,
            "rejected": dict(self.rejected),
            "rejected-reasons": dict(self.rejected_reasons),
            "failed": dict(self.failed),
        }


def _unpack(msg: Message) -> tuple[str, dict[str, float], bytes]:
    """(device id, metrics, update frame) of a reply; the frame is checked by the codec."""
    content = msg.content
    try:
        device = str(content.config_records[DEVICE]["device-id"])
        metrics = {k: float(v) for k, v in content.metric_records[METRICS].items()}  # type: ignore[arg-type]
        frame = content.config_records[UPDATE][FRAME]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed reply: {err}") from err
    if not isinstance(frame, bytes):
        raise ValueError("the update frame is not bytes")
    for key in ("num-examples", "batch-size", "step-s", "train-loss"):
        if key not in metrics:
            raise ValueError(f"reply lacks metric {key}")
    if not all(math.isfinite(metrics[k]) for k in ("num-examples", "batch-size")):
        raise ValueError("non-finite counts")
    return device, metrics, frame
