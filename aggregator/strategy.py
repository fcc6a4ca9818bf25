"""The fedstream strategy: per-device plans out, validated and weighted updates in.

Built on Flower's ``flwr.serverapp.strategy.Strategy``. Unlike ``FedAvg`` it

* gives each device its own plan (a fresh ``ConfigRecord`` per message: Flower would
  otherwise share one object between all messages),
* keys everything by ``device-id`` (Flower's node ids change when a SuperNode restarts),
* weights the average by the samples each device actually used (``num-examples``),
* leaves out replies that are errors, from unknown devices, malformed or non-finite, and
  counts them per device.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from aggregator.controller import BatchController, Plan
from aggregator.settings import RunSettings
from edge_client.protocol import ARRAYS, CONFIG, DEVICE, METRICS, plan_to_config
from edge_client.trainer import LocalPlan

__all__ = ["DeviceReport", "StreamStrategy"]


@dataclass
class DeviceReport:
    """One device's reply in one round (the per-device part of the metrics JSONL)."""

    device_id: str
    node_id: int
    metrics: dict[str, float]
    planned_batch: int


@dataclass
class StreamStrategy(Strategy):
    """Per-device batch plans (OmniLearn/ScaDLES) and sample-weighted aggregation.

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
    last_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    # Set by configure_train / aggregate_train for the round just run.
    plan: Plan = field(default_factory=lambda: Plan({}))
    reports: list[DeviceReport] = field(default_factory=list)
    round_s: float = 0.0
    _shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # message id -> node, this round
    planned: dict[int, int] = field(default_factory=dict)  # node -> planned batch, this round

    # -- training ---------------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One message per node with this device's plan (batch, steps, scaled lr)."""
        self._shapes = {k: tuple(a.shape) for k, a in arrays.items()}
        nodes = sorted(grid.get_node_ids())
        ids = {n: self.node_devices.get(n, f"node-{n}") for n in nodes}
        self.plan = self.controller.plan(list(ids.values()), server_round, self._available())
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
            )
            cfg = plan_to_config(local, server_round)  # a fresh record per message
            for key, value in config.items():
                cfg[key] = value
            content = RecordDict({ARRAYS: arrays, CONFIG: cfg})
            messages.append(Message(content, node, MessageType.TRAIN, group_id=str(server_round)))
        return messages

    def _available(self) -> dict[str, float]:
        """ScaDLES cap: what each device can have by the end of the round."""
        horizon = self.round_s or self.settings.round_timeout / 2
        return {
            d: m["buffer-fill"] + m["stream-rate"] * horizon for d, m in self.last_metrics.items()
        }

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the valid updates, weighted by samples used; feed the controller."""
        self.reports = []
        updates: list[tuple[dict[str, torch.Tensor], int]] = []
        # Error replies come from the SuperLink (src node 1): find the node by message id.
        sent = self.sent
        replies_seen = list(replies)
        for msg in replies_seen:
            node = sent.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)
            if msg.has_error():
                self.failed[self.node_devices.get(node, f"node-{node}")] += 1
                continue
            try:
                device, metrics, weights = _unpack(msg)
            except ValueError:
                self.rejected[self.node_devices.get(node, f"node-{node}")] += 1
                continue
            self._learn_device(node, device)
            if not _compatible(weights, self._shapes):
                self.rejected[device] += 1
                continue
            self.last_metrics[device] = metrics
            self.reports.append(DeviceReport(device, node, metrics, self.planned.get(node, 0)))
            used = int(metrics["num-examples"])
            if used > 0:
                updates.append((weights, used))
                self.controller.observe(device, int(metrics["batch-size"]), metrics["step-s"])
        answered = {m.metadata.reply_to_message_id for m in replies_seen}
        for mid, node in sent.items():  # no reply before the round timeout
            if mid not in answered:
                self.failed[self.node_devices.get(node, f"node-{node}")] += 1
        if not updates:
            return None, None
        total = sum(n for _, n in updates)
        avg: dict[str, torch.Tensor] = {}
        for k, ref in updates[0][0].items():
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for w, n in updates:
                acc += w[k].double() * (n / total)
            avg[k] = acc.to(ref.dtype)
        loss = sum(r.metrics["train-loss"] * r.metrics["num-examples"] for r in self.reports)
        summary = MetricRecord({"train-loss": loss / total, "num-examples": total})
        return ArrayRecord(avg), summary

    def _learn_device(self, node: int, device: str) -> None:
        """Map node -> device id; a device on a new node (restart) keeps its state."""
        for old, dev in list(self.node_devices.items()):
            if dev == device and old != node:
                del self.node_devices[old]
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
            "last-metrics": self.last_metrics,
            "rejected": dict(self.rejected),
            "failed": dict(self.failed),
        }


def _unpack(msg: Message) -> tuple[str, dict[str, float], dict[str, torch.Tensor]]:
    content = msg.content
    try:
        device = str(content.config_records[DEVICE]["device-id"])
        metrics = {k: float(v) for k, v in content.metric_records[METRICS].items()}  # type: ignore[arg-type]
        weights = content.array_records[ARRAYS].to_torch_state_dict()
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"malformed reply: {err}") from err
    for key in ("num-examples", "batch-size", "step-s", "train-loss"):
        if key not in metrics:
            raise ValueError(f"reply lacks metric {key}")
    if metrics["num-examples"] > 0 and not all(torch.isfinite(t).all() for t in weights.values()):
        raise ValueError("update holds NaN or Inf")
    if not all(math.isfinite(metrics[k]) for k in ("num-examples", "batch-size")):
        raise ValueError("non-finite counts")
    return device, metrics, weights


def _compatible(weights: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> bool:
    """Same tensor names and shapes as the global model."""
    return weights.keys() == shapes.keys() and all(
        tuple(weights[k].shape) == shapes[k] for k in shapes
    )
