"""The fleet registry: which device each Flower node serves, and what each device has done.

Everything is keyed by ``device-id`` (from the device's replies): Flower's node ids change
when a SuperNode restarts without node authentication. A node seen before its first reply
goes by a placeholder name, ``node-<id>``. When a device turns up on a new node, its old
node is *retired*: the SuperLink lists a dead node for about a minute, and planning work for
it would cost every round a timeout. A retired node keeps its device's name, so a message
that was already out to it fails as that device's, not as an anonymous node's.

The registry also keeps each device's last reply (the controller's and the adaptive
codec's inputs) and counts failures (error replies, no reply) and refusals (replies or
updates that could not be accepted) per device and per reason. :meth:`state_dict` and
:meth:`load_state_dict` carry all of it through a checkpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_client.wire.mapping import from_mapping, to_mapping
from edge_client.wire.records import ReplyMetrics

__all__ = ["FleetRegistry"]


@dataclass
class _FleetState:
    """The registry as a checkpoint holds it (keys: the fields in kebab case)."""

    node_devices: dict[str, str] = field(default_factory=dict)
    retired_nodes: list[int] = field(default_factory=list)
    last_metrics: dict[str, ReplyMetrics] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    rejected_reasons: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)


@dataclass
class FleetRegistry:
    """Nodes, devices, their last replies and their failure and refusal counters."""

    node_devices: dict[int, str] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)
    last_replies: dict[str, ReplyMetrics] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    rejected_reasons: Counter[str] = field(default_factory=Counter)

    def device_of(self, node: int) -> str:
        """The device a node serves, or its placeholder ``node-<id>`` before it replied."""
        return self.node_devices.get(node, f"node-{node}")

    def live_nodes(self, nodes: Iterable[int]) -> list[int]:
        """The nodes worth planning for (retired ones left out), sorted."""
        return sorted(n for n in nodes if n not in self.retired)

    def learn(self, node: int, device: str) -> str | None:
        """Record that ``node`` serves ``device``; a device on a new node retires its old one.

        Returns
        -------
        str or None
            The name the node went by until now (its placeholder), when that changed: what
            was planned under it now belongs to ``device``.
        """
        if self.node_devices.get(node) == device:
            return None  # the usual case: known (and no scan over the fleet per reply)
        for old, dev in self.node_devices.items():
            if dev == device and old != node:
                # Kept under its device: a message out to it when it is retired (the
                # SuperLink still lists a dead node for a while) fails as that device's.
                self.retired.add(old)
        self.node_devices[node] = device
        return f"node-{node}"

    def record_reply(self, device: str, metrics: ReplyMetrics) -> None:
        """Keep a device's latest accepted reply."""
        self.last_replies[device] = metrics

    def record_failure(self, device: str) -> None:
        """An error reply, or none before the round's timeout."""
        self.failed[device] += 1

    def record_refusal(self, device: str, reason: str) -> None:
        """A reply or update that was refused (left out of the round), and why."""
        self.rejected[device] += 1
        self.rejected_reasons[reason] += 1

    def opted_in(self, devices: Iterable[str]) -> list[str]:
        """The devices whose last reply said they take part in data injection."""
        return [
            d for d in devices if d in self.last_replies and self.last_replies[d].inject_opt_in >= 1
        ]

    def state_dict(self) -> dict[str, Any]:
        """The registry as a JSON-ready mapping (for the aggregator's checkpoint)."""
        return to_mapping(
            _FleetState(
                node_devices={str(n): d for n, d in self.node_devices.items()},
                retired_nodes=sorted(self.retired),
                last_metrics=dict(self.last_replies),
                rejected=dict(self.rejected),
                rejected_reasons=dict(self.rejected_reasons),
                failed=dict(self.failed),
            )
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (keys of other parts of a checkpoint are
        ignored)."""
        saved = from_mapping(_FleetState, state)
        self.node_devices = {int(n): d for n, d in saved.node_devices.items()}
        self.retired = set(saved.retired_nodes)
        self.last_replies = dict(saved.last_metrics)
        self.rejected = Counter(saved.rejected)
        self.rejected_reasons = Counter(saved.rejected_reasons)
        self.failed = Counter(saved.failed)
