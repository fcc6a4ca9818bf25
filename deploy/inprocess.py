"""The in-process runner: the real ServerApp and ClientApp in one process, on a virtual clock.

For tests and benchmarks. :class:`InProcessGrid` is a Flower ``Grid`` that hands each
message straight to the ClientApp of a *virtual device*: a buffer store of its own, fed by a
replayed synthetic stream at the device's rate on the virtual clock, and a slowdown charged
on that clock instead of slept. It also plays the broker for data injection: after each
round it delivers every opted-in device's outbox to the other opted-in devices' pools
(:func:`edge_client.inject.receive`, as their ingest daemons would). A round costs the
slowest device's ``compute * slowdown + wait + bytes / bandwidth`` (synchronous rounds).
Every time it reports is virtual-clock time; say so wherever it is printed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from edge_client.buffer import BufferStore
from edge_client.client_app import app as default_client_app
from edge_client.constants import (
    DEFAULT_NUM_CLASSES,
    POLICY_TRUNCATION,
    SUPERLINK_NODE_ID,
)
from edge_client.datasets import load_dataset
from edge_client.frames import SampleBatch
from edge_client.inject import open_pool, receive
from edge_client.protocol import CONFIG, METRICS, plan_from_config
from edge_client.schedule import device_rng
from edge_client.sources import SampleSource, label_distribution

__all__ = ["InProcessGrid", "LocalGrid", "VirtualDevice"]

FIRST_NODE_ID = 100


@dataclass
class VirtualDevice:
    """A simulated device.

    Parameters
    ----------
    device_id : str
        Its id (controller state is keyed by it).
    slowdown : float
        Compute-time multiplier charged on the virtual clock.
    rate : float
        Stream rate, samples per virtual second; ``math.inf``: a stream always ahead of
        training (each round finds exactly what it takes, without waiting).
    initial : int
        Samples buffered before the first round.
    fail_rounds : set of int
        Rounds in which it does not answer (dropout).
    labels : sequence of int, optional
        Only these classes (pathological label skew).
    dirichlet : float, optional
        Class mix drawn from Dirichlet(alpha) (label skew).
    feature_shift : float
        Per-device sensor gain/bias scale (feature skew).
    inject : bool
        Opted in to ScaDLES data injection (shares when picked, mixes in the pool).
    policy, capacity
        Its buffer's overflow policy and capacity in samples.
    """

    device_id: str
    slowdown: float = 1.0
    rate: float = 200.0
    initial: int = 2000
    fail_rounds: set[int] = field(default_factory=set)
    labels: Sequence[int] | None = None
    dirichlet: float | None = None
    feature_shift: float = 0.0
    inject: bool = False
    policy: str = POLICY_TRUNCATION
    capacity: int = 10**7


class LocalGrid(Grid):
    """A Grid living in this process (run 1, the SuperLink's identity): the plumbing that
    every in-process grid shares. Subclasses say which nodes exist and what a push does."""

    def __init__(self) -> None:
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        TaskIdentity.task_id = 1
        self._run = Run.create_empty(1)

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push, then pull every reply."""
        return self.pull_messages(self.push_messages(messages))


class InProcessGrid(LocalGrid):
    """A Grid whose nodes are :class:`VirtualDevice` s served by a ClientApp in-process.

    Parameters
    ----------
    devices : sequence of VirtualDevice
        The fleet.
    workdir : Path
        Where the buffer files go.
    run_config : dict
        Flower run config handed to the ClientApp.
    client_app : ClientApp
        Defaults to fedstream's.
    uplink_mbps : float
        Bandwidth charged for ``bytes-up`` on the virtual clock.
    seed : int
        Seeds the replayed streams.
    step_time : callable, optional
        Seconds per training step at a batch size on a reference device. When given, each
        device is charged ``step_time(b) * slowdown`` per step on the virtual clock instead
        of its measured time, which makes results independent of the host's load.
    on_round : callable, optional
        Called with ``(round, grid)`` before each round (e.g. to change slowdowns).
    dataset : str
        What the streams carry (:mod:`edge_client.datasets`); ``num-classes`` comes from
        ``run_config``.
    """

    def __init__(
        self,
        devices: Sequence[VirtualDevice],
        workdir: Path,
        run_config: dict[str, Any] | None = None,
        client_app: ClientApp | None = None,
        uplink_mbps: float = 10.0,
        seed: int = 0,
        step_time: Callable[[int], float] | None = None,
        on_round: Callable[[int, InProcessGrid], None] | None = None,
        dataset: str = "synthetic",
    ) -> None:
        super().__init__()
        self.devices = {FIRST_NODE_ID + i: d for i, d in enumerate(devices)}
        self.run_config = dict(run_config or {})
        self.client_app = client_app or default_client_app
        self.uplink_mbps = uplink_mbps
        self.step_time = step_time
        self.on_round = on_round
        self.fill_log: list[dict[str, int]] = []  # per round: each buffer's fill before training
        self.clock = 0.0  # virtual seconds
        self.round = 0
        self.round_times: list[float] = []
        self._last_round_s = 0.0
        data = load_dataset(dataset, int(self.run_config.get("num-classes", DEFAULT_NUM_CLASSES)))
        self._classes = data.num_classes
        self.stores: dict[int, BufferStore] = {}
        self.pools: dict[int, BufferStore] = {}
        self.inject_rejected: Counter[str] = Counter()
        self.inject_delivered = 0  # messages delivered (each to every other opted-in device)
        self.sources: dict[int, SampleSource] = {}
        self._owed: dict[int, float] = {}
        self._replies: dict[str, Message] = {}
        workdir.mkdir(parents=True, exist_ok=True)
        for node, dev in self.devices.items():
            rng = device_rng(seed, dev.device_id)
            probs = label_distribution(data.num_classes, rng, dev.labels, dev.dirichlet)
            self.sources[node] = data.source(rng, probs, dev.feature_shift)
            path = workdir / f"{dev.device_id}.sqlite"
            self.stores[node] = BufferStore(
                path, shape=data.shape, policy=dev.policy, capacity=dev.capacity
            )
            if dev.inject:
                self.pools[node] = open_pool(path, data.shape)
            self._feed(node, dev.initial)
            self._owed[node] = 0.0

    # -- Grid API ---------------------------------------------------------------------------

    def get_node_ids(self) -> Iterable[int]:
        return list(self.devices)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Run each device's ClientApp now (one push = one round); keep the replies."""
        messages = list(messages)
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex
        for reply in self._round(messages):
            self._replies[reply.metadata.reply_to_message_id] = reply
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to these messages (all are there after the push)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def _round(self, messages: list[Message]) -> list[Message]:
        """Run each device's ClientApp; charge the round on the virtual clock."""
        self.round += 1
        if self.on_round is not None:
            self.on_round(self.round, self)
        for node, dev in self.devices.items():  # what streamed in during the last round
            if math.isfinite(dev.rate):
                self._feed(node, dev.rate * self._last_round_s)
        replies: list[Message] = []
        fills: dict[str, int] = {}
        round_s = 0.0
        for msg in messages:
            node = msg.metadata.dst_node_id
            dev = self.devices[node]
            if self.round in dev.fail_rounds:
                replies.append(Message(Error(code=0, reason="device offline"), reply_to=msg))
                continue
            virtual_wait = self._emulate_wait(node, msg.content.config_records[CONFIG])
            # The wait was charged on the virtual clock; the ClientApp must not sleep it again.
            msg.content.config_records[CONFIG]["deadline-s"] = 0.0
            fills[dev.device_id] = self.stores[node].fill
            context = Context(
                run_id=1,
                node_id=node,
                node_config={
                    "device-id": dev.device_id,
                    "buffer": str(self.stores[node].path),
                    "inject": dev.inject,
                },
                state=RecordDict(),
                run_config=self.run_config,
            )
            reply = self.client_app(msg, context)
            if reply.has_content():
                m = reply.content.metric_records[METRICS]
                if self.step_time is not None and int(m["batch-size"]) > 0:  # type: ignore[arg-type]
                    m["step-s"] = self.step_time(int(m["batch-size"]))  # type: ignore[arg-type]
                    m["compute-s"] = float(m["step-s"]) * int(m["local-steps"])  # type: ignore[arg-type]
                m["compute-s"] = float(m["compute-s"]) * dev.slowdown  # type: ignore[arg-type]
                m["step-s"] = float(m["step-s"]) * dev.slowdown  # type: ignore[arg-type]
                m["wait-s"] = virtual_wait
                transfer = float(m["bytes-up"]) * 8 / (self.uplink_mbps * 1e6)  # type: ignore[arg-type]
                round_s = max(round_s, float(m["compute-s"]) + virtual_wait + transfer)  # type: ignore[arg-type]
            replies.append(reply)
        self._deliver_injections()
        self.fill_log.append(fills)
        self._last_round_s = round_s
        self.round_times.append(round_s)
        self.clock += round_s
        return replies

    def _deliver_injections(self) -> None:
        """Play the broker: each opted-in device's outbox to every other opted-in pool."""
        for node, store in self.stores.items():
            queued = store.outbox(limit=10**6)
            if not queued:
                continue
            store.ack_outbox([i for i, _ in queued])
            if node not in self.pools:
                continue  # not opted in: its daemon would not publish (and it never queues)
            for other, pool in self.pools.items():
                if other != node:
                    payloads = [p for _, p in queued]
                    self.inject_rejected += receive(
                        pool, payloads, self.devices[other].device_id, self._classes, 0.0
                    )
                    self.inject_delivered += len(payloads)

    # -- virtual streams --------------------------------------------------------------------

    def _feed(self, node: int, amount: float) -> None:
        """Append ``amount`` samples (carrying fractions over) from the device's stream."""
        owed = self._owed.get(node, 0.0) + amount
        n = int(owed)
        self._owed[node] = owed - n
        if n > 0:
            x, y = self.sources[node].next(n)
            ts = [self.clock] * n
            batch = SampleBatch(x=x, y=y, ts=ts)  # type: ignore[arg-type]
            rate = self.devices[node].rate
            self.stores[node].append([batch], rate=rate if math.isfinite(rate) else None)

    def _emulate_wait(self, node: int, config: ConfigRecord) -> float:
        """Stream in the samples the device would wait for, and charge that wait."""
        dev = self.devices[node]
        plan = plan_from_config(config)
        if math.isinf(dev.rate):  # a stream always ahead: exactly what the round takes
            self._feed(node, plan.batch_size * plan.local_steps - self.stores[node].fill)
            return 0.0
        per_step = plan.batch_size if plan.wait_policy == "wait" else plan.b_min
        deficit = per_step * plan.local_steps - self.stores[node].fill
        if deficit <= 0 or dev.rate <= 0:
            return 0.0
        wait = min(deficit / dev.rate, plan.deadline_s)
        self._feed(node, dev.rate * wait)
        return wait

    def close(self) -> None:
        """Close the buffer files."""
        for store in [*self.stores.values(), *self.pools.values()]:
            store.close()
