"""The in-process runner: the real ServerApp and ClientApp in one process, on a virtual clock.

For tests and benchmarks. :class:`InProcessGrid` is a Flower ``Grid`` that hands each
message straight to the ClientApp of a *virtual device*: a buffer store of its own, fed by a
replayed synthetic stream whose deliveries are a function of its rate and the virtual time
(:class:`~edge_client.emulation.virtual_stream.VirtualStream`), and a slowdown charged on that
clock instead of slept. It also plays the broker for data injection: after each round it
delivers every opted-in device's outbox to the other opted-in devices' pools
(:func:`edge_client.runtime.injection.receive`, as their ingest daemons would).

Synchronous rounds (``mode = "sync"``): a push is a round, which costs the slowest device's
``compute * slowdown + wait + bytes / bandwidth``; with ``deadline_s`` a reply that would
arrive later is dropped (an error reply: what a sync round with a deadline does) and the
round costs the deadline. A device offline when the round starts answers with an error at
once (the most favourable case for sync rounds: they never wait for it); a round in which
every device is off lasts until the first comes back.

Asynchronous mode (``mode = "async"``): events on one virtual clock per device. A pushed
message starts on its device when the device is free and online (a message to a device that
is off waits for it, as a SuperNode's messages wait at the SuperLink), is served by the
ClientApp there and then, and its reply arrives ``wait + compute * slowdown + bytes /
bandwidth`` later; a pull returns the earliest reply among those asked for and moves the
grid's clock to its arrival. So updates are applied in order of virtual arrival.

Every time it reports is virtual-clock time; say so wherever it is printed.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from uuid import uuid4

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from aggregator.round_log import virtual_round_s
from aggregator.secure_round import SECAGG_MESSAGE, payload_bytes
from deploy.constants import SERVER_COST
from edge_client.emulation.sources import (
    ChangingSource,
    SampleSource,
    SensorChange,
    dataset_source,
    label_distribution,
)
from edge_client.emulation.virtual_stream import VirtualStream
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.client_app import app as default_client_app
from edge_client.runtime.constants import POLICY_TRUNCATION
from edge_client.runtime.injection import open_pool, receive
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.outbox import Outbox
from edge_client.runtime.seeding import device_rng
from edge_client.runtime.trainer import step_sizes
from edge_client.task.datasets import load_dataset
from edge_client.wire import records
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings, default

__all__ = [
    "InProcessGrid",
    "LocalGrid",
    "ServerCost",
    "StaticGrid",
    "VirtualDevice",
    "as_superlink",
    "model_bytes",
]

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
        Rounds in which it does not answer (dropout; synchronous rounds).
    offline : sequence of (float, float)
        Spans of virtual time ``[start, end)`` in which the device is off (intermittent
        devices): see the module notes for what each mode makes of it.
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
    source : SampleSource, optional
        What its stream carries, when not the run's ``dataset`` (a user's recording
        replayed, a device whose sensors send another shape); the label skew and feature
        shift above then do not apply.
    change : SensorChange, optional
        Its stream changes part-way (drift).
    model_dir : str
        Its ClientApp keeps each global model it receives there (node config ``model-dir``).
    drift : {"none", "adwin"}
        Its ClientApp watches its prequential error for changes (node config ``drift``).
    agent : str
        The socket of its ``fedstream agent`` (node config ``agent``): its rounds run there.
    """

    device_id: str
    slowdown: float = 1.0
    rate: float = 200.0
    initial: int = default("sim_initial")
    fail_rounds: set[int] = field(default_factory=set)
    offline: Sequence[tuple[float, float]] = ()
    labels: Sequence[int] | None = None
    dirichlet: float | None = None
    feature_shift: float = 0.0
    inject: bool = False
    policy: str = POLICY_TRUNCATION
    capacity: int = 10**7
    source: SampleSource | None = None
    change: SensorChange | None = None
    model_dir: str = ""
    drift: str = "none"
    agent: str = ""

    def online_at(self, at: float) -> bool:
        """Whether the device is on at virtual time ``at``."""
        return not any(start <= at < end for start, end in self.offline)

    def online_from(self, at: float) -> float:
        """The first virtual time from ``at`` at which the device is on."""
        moved = True
        while moved:  # spans may touch or overlap
            moved = False
            for start, end in self.offline:
                if start <= at < end:
                    at, moved = end, True
        return at


def as_superlink(run_id: int = 1) -> None:
    """Make messages in this process as the SuperLink's side of run ``run_id`` does
    (Flower 1.42 stamps each new message with the process's task identity)."""
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    TaskIdentity.task_id = 1


class LocalGrid(Grid):
    """A Grid living in this process (run 1, the SuperLink's identity): the plumbing that
    every in-process grid shares. Subclasses say which nodes exist and what a push does."""

    def __init__(self) -> None:
        as_superlink()
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

    @staticmethod
    def assign_ids(messages: Sequence[Message]) -> list[str]:
        """Give each message the id a SuperLink would (Flower's messages get theirs when
        they are pushed); return them in order."""
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # no public setter in 1.42
        return [m.metadata.message_id for m in messages]


class StaticGrid(LocalGrid):
    """A Grid that only lists its nodes and takes messages: enough to plan a round without
    running one (strategy tests, the aggregator-at-scale benchmark), whose replies are then
    built by hand."""

    def __init__(self, node_ids: Iterable[int]) -> None:
        super().__init__()
        self.node_ids = list(node_ids)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Accept the messages (their ids, as a SuperLink would give them); run nothing."""
        return self.assign_ids(list(messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("a StaticGrid runs no ClientApp")


@dataclass(frozen=True)
class ServerCost:
    """The aggregator's own work on the virtual clock, per round (or asynchronous
    aggregation): lines in the work done (:data:`deploy.constants.SERVER_COST`, measured
    once by ``dev/server_cost.py``, so that fixed-seed runs stay deterministic).

    Attributes
    ----------
    aggregate_s, aggregate_per_value_s : float
        Combining ``n`` updates of ``P`` values: ``aggregate_s + aggregate_per_value_s *
        n * P`` seconds (none without updates).
    evaluate_s, evaluate_per_sample_parameter_s : float
        Scoring ``S`` held-out samples on a model of ``P`` parameters: ``evaluate_s +
        evaluate_per_sample_parameter_s * S * P`` seconds (none without ``eval-data``).
    """

    aggregate_s: float = SERVER_COST["aggregate_s"]
    aggregate_per_value_s: float = SERVER_COST["aggregate_per_value_s"]
    evaluate_s: float = SERVER_COST["evaluate_s"]
    evaluate_per_sample_parameter_s: float = SERVER_COST["evaluate_per_sample_parameter_s"]

    def seconds(self, updates: int, values: int, eval_samples: int) -> float:
        """The virtual seconds of one aggregation of ``updates`` updates of ``values``
        values each, then one evaluation on ``eval_samples`` samples."""
        aggregate = self.aggregate_s + self.aggregate_per_value_s * updates * values
        evaluate = self.evaluate_s + self.evaluate_per_sample_parameter_s * eval_samples * values
        return (aggregate if updates > 0 else 0.0) + (evaluate if eval_samples > 0 else 0.0)


def model_bytes(msg: Message) -> int:
    """The bytes of the model a message carries down (its arrays; 0 for a probe)."""
    return sum(
        len(array.data)
        for record in msg.content.array_records.values()
        for array in record.values()
    )


class InProcessGrid(LocalGrid):
    """A Grid whose nodes are :class:`VirtualDevice` s served by a ClientApp in-process.

    Parameters
    ----------
    devices : sequence of VirtualDevice
        The fleet.
    workdir : Path
        Where the buffer files go.
    settings : RunSettings, optional
        The run's settings: what the streams carry (``dataset``, ``num-classes``) and the
        run config the ClientApp sees (pass the ServerApp's; defaults otherwise).
    client_app : ClientApp
        Defaults to fedstream's.
    seed : int, optional
        Seeds the replayed streams (default: the settings' seed). The uplink charged for
        ``bytes-up`` on the virtual clock is the settings' ``uplink-mbps``.
    step_time : callable, optional
        Seconds per training step at a batch size on a reference device (called once per
        step: it may draw noise). When given, each device is charged ``step_time(b) *
        slowdown`` per step on the virtual clock instead of its measured time, which makes
        results independent of the host's load.
    on_round : callable, optional
        Called with ``(round, grid)`` before each round (e.g. to change slowdowns;
        synchronous rounds only).
    deadline_s : float, optional
        Synchronous rounds: virtual seconds after which a round stops waiting; later
        replies are dropped (error replies).
    server_cost : ServerCost, optional
        The aggregator's aggregation and evaluation on the virtual clock (default: the
        measured lines); the ServerApp reports its work through :meth:`charge_server`.
    """

    #: Times are virtual: the ServerApp takes the cap's horizon from this clock.
    virtual_clock = True

    def __init__(
        self,
        devices: Sequence[VirtualDevice],
        workdir: Path,
        settings: RunSettings | None = None,
        client_app: ClientApp | None = None,
        seed: int | None = None,
        step_time: Callable[[int], float] | None = None,
        on_round: Callable[[int, InProcessGrid], None] | None = None,
        deadline_s: float | None = None,
        server_cost: ServerCost | None = None,
    ) -> None:
        super().__init__()
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.devices = {FIRST_NODE_ID + i: d for i, d in enumerate(devices)}
        self.settings = settings or RunSettings()
        self._run_config = self.settings.to_run_config()  # what every ClientApp is handed
        self.client_app = client_app or default_client_app
        self.step_time = step_time
        self.on_round = on_round
        self.deadline_s = deadline_s
        self.server_cost = server_cost or ServerCost()
        self.server_s = 0.0  # virtual seconds charged for the aggregator's own work
        self.asynchronous = self.settings.asynchrony.mode == "async"
        self.missed = 0  # sync replies dropped at the deadline
        self.served = 0  # async messages served
        # Async events: (virtual arrival, push order, message id) of the replies out, and
        # when each device is next free.
        self._arrivals: list[tuple[float, int, str]] = []
        self._order = itertools.count()
        self._free_at: dict[int, float] = {}
        self.fill_log: list[dict[str, int]] = []  # per round: each buffer's fill before training
        self.last_fill = 0  # the fill the last device served had before training
        self.clock = 0.0  # virtual seconds
        self.round = 0
        self.round_times: list[float] = []
        # The run's dataset, for the devices that stream it (none: all bring their own).
        learning = self.settings.learning
        run_data = (
            None
            if all(d.source is not None for d in devices)
            else load_dataset(learning.dataset, learning.shape, learning.num_classes)
        )
        self.stores: dict[int, BufferStore] = {}
        self.outboxes: dict[int, Outbox] = {}
        self.pools: dict[int, BufferStore] = {}
        self.streams: dict[int, VirtualStream] = {}
        self.inject_rejected: Counter[str] = Counter()
        self.inject_delivered = 0  # messages delivered (each to every other opted-in device)
        self._replies: dict[str, Message] = {}
        workdir.mkdir(parents=True, exist_ok=True)
        for node, dev in self.devices.items():
            source = dev.source
            if source is None:
                assert run_data is not None
                rng = device_rng(self.settings.seed if seed is None else seed, dev.device_id)
                probs = label_distribution(run_data.num_classes, rng, dev.labels, dev.dirichlet)
                source = dataset_source(run_data, rng, probs, dev.feature_shift)
            if dev.change is not None:
                source = ChangingSource(source, dev.change)
            path = workdir / f"{dev.device_id}.sqlite"
            self.stores[node] = BufferStore(
                path, shape=source.shape, policy=dev.policy, capacity=dev.capacity
            )
            self.outboxes[node] = Outbox(path)
            if dev.inject:
                self.pools[node] = open_pool(path, source.shape)
            self.streams[node] = VirtualStream(
                self.stores[node], source, dev.rate, initial=dev.initial, start=self.clock
            )

    # -- Grid API ---------------------------------------------------------------------------

    def get_node_ids(self) -> Iterable[int]:
        return list(self.devices)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Synchronous: run each device's ClientApp now (one push = one round).
        Asynchronous: start each message on its device's own clock. Keep the replies."""
        messages = list(messages)
        ids = self.assign_ids(messages)
        queries = [m for m in messages if m.metadata.message_type == MessageType.QUERY]
        if queries:
            run = self._probe(queries)
        elif any(m.metadata.message_type == SECAGG_MESSAGE for m in messages):
            run = self._secure_stage(messages)
        elif self.asynchronous:
            run = [self._start(m, i) for m, i in zip(messages, ids, strict=True)]
        else:
            run = self._round(messages)
        for reply in run:
            self._replies[reply.metadata.reply_to_message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Synchronous: the replies to these messages (all are there after the push).
        Asynchronous: the one among them that arrives first; the clock moves to it."""
        ids = list(message_ids)
        if not self.asynchronous or not self._arrivals:
            return [self._replies.pop(i) for i in ids if i in self._replies]
        wanted = set(ids)
        passed: list[tuple[float, int, str]] = []
        reply = None
        while self._arrivals:
            event = heapq.heappop(self._arrivals)
            if event[2] in wanted:
                self.clock = max(self.clock, event[0])
                reply = self._replies.pop(event[2])
                break
            passed.append(event)
        for event in passed:
            heapq.heappush(self._arrivals, event)
        if reply is None:
            return []
        self._deliver_injections()
        return [reply]

    def _start(self, msg: Message, message_id: str) -> Message:
        """Asynchronous: serve ``msg`` on its device from when the device is free and on;
        schedule its reply's arrival."""
        node = msg.metadata.dst_node_id
        dev = self.devices[node]
        start = dev.online_from(max(self.clock, self._free_at.get(node, 0.0)))
        reply, seconds = self._serve(msg, node, dev, start)
        self.served += 1
        self._free_at[node] = start + seconds
        heapq.heappush(self._arrivals, (start + seconds, next(self._order), message_id))
        return reply

    def _serve(
        self, msg: Message, node: int, dev: VirtualDevice, at: float
    ) -> tuple[Message, float]:
        """Run the device's ClientApp at virtual time ``at``; return the reply (its timings
        charged on the virtual clock) and the virtual seconds it took: the model's download,
        the wait, compute and the update's upload (0 for a reply that is not a device's).
        The buffer's fill once the wait is over is in :attr:`last_fill`."""
        plan = records.RoundPlan.from_record(msg.content.config_records[records.CONFIG])
        # The model comes down first (at the uplink's speed: a symmetric link); the stream
        # goes on arriving meanwhile, so the wait starts once it is in.
        down_s = model_bytes(msg) * 8 / (self.settings.uplink_mbps * 1e6)
        virtual_wait = self.streams[node].wait_for(plan, at + down_s)
        self.last_fill = self.stores[node].fill
        # The wait was charged on the virtual clock; the ClientApp must not sleep it again.
        msg.content.config_records[records.CONFIG][kebab("deadline_s")] = 0.0
        reply = self.client_app(msg, self._context(node, dev))
        if not reply.has_content():
            return reply, 0.0
        try:
            charged = self._charge(
                records.DeviceReply.from_content(reply.content), dev, virtual_wait
            )
        except records.RecordError:  # a reply the aggregator will refuse: left as it is
            return reply, down_s + virtual_wait
        reply.content.metric_records[records.METRICS] = charged.to_record()
        return reply, down_s + virtual_round_s([charged], self.settings.uplink_mbps)

    def _round(self, messages: list[Message]) -> list[Message]:
        """Run each device's ClientApp; charge the round on the virtual clock."""
        self.round += 1
        if self.on_round is not None:
            self.on_round(self.round, self)
        for node, dev in self.devices.items():  # a rate on_round changed applies from now
            self.streams[node].set_rate(dev.rate, self.clock)
        replies: list[Message] = []
        round_s = 0.0
        fills: dict[str, int] = {}
        back: list[float] = []  # when the devices that are off come back
        for msg in messages:
            node = msg.metadata.dst_node_id
            dev = self.devices[node]
            if self.round in dev.fail_rounds or not dev.online_at(self.clock):
                replies.append(Message(Error(code=0, reason="device offline"), reply_to=msg))
                back.append(dev.online_from(self.clock))
                continue
            reply, seconds = self._serve(msg, node, dev, self.clock)
            fills[dev.device_id] = self.last_fill
            if self.deadline_s is not None and seconds > self.deadline_s:
                self.missed += 1
                reply = Message(Error(code=0, reason="missed the round's deadline"), reply_to=msg)
                seconds = self.deadline_s
            round_s = max(round_s, seconds)
            replies.append(reply)
        if len(back) == len(messages) and back:  # nobody on: the round waits for the first back
            round_s = min(back) - self.clock
        self._deliver_injections()
        self.fill_log.append(fills)
        self.round_times.append(round_s)
        self.clock += round_s
        for stream in self.streams.values():  # what arrived while the round ran
            stream.advance_to(self.clock)
        return replies

    def _probe(self, messages: list[Message]) -> list[Message]:
        """Answer the timing probe; charge its steps (warm-up included) on the virtual clock,
        timed as the rounds' steps are (the step-time model's, when given, x slowdown)."""
        replies, spent = [], 0.0
        for msg in messages:
            node = msg.metadata.dst_node_id
            dev = self.devices[node]
            reply = self.client_app(msg, self._context(node, dev))
            if reply.has_content():
                probe = records.ProbeReply.from_content(reply.content)
                steps = records.ProbePlan.from_record(
                    msg.content.config_records[records.CONFIG]
                ).steps
                step_s = [
                    (self.step_time(b) if self.step_time is not None else t) * dev.slowdown
                    for b, t in zip(probe.batches, probe.step_s, strict=True)
                ]
                charged = replace(probe, step_s=step_s)
                reply.content = charged.to_content()
                spent = max(spent, charged.compute_s(steps))
            replies.append(reply)
        self.clock += spent
        for stream in self.streams.values():
            stream.advance_to(self.clock)
        return replies

    def _secure_stage(self, messages: list[Message]) -> list[Message]:
        """Answer a secure-aggregation stage; charge its slowest transfer (the stage's bytes
        down and up at the uplink's speed) on the virtual clock."""
        replies, spent = [], 0.0
        for msg in messages:
            node = msg.metadata.dst_node_id
            reply = self.client_app(msg, self._context(node, self.devices[node]))
            moved = payload_bytes(msg) + (payload_bytes(reply) if reply.has_content() else 0)
            spent = max(spent, moved * 8 / (self.settings.uplink_mbps * 1e6))
            replies.append(reply)
        self.clock += spent
        for stream in self.streams.values():
            stream.advance_to(self.clock)
        return replies

    def charge_server(self, updates: int, values: int, eval_samples: int) -> float:
        """The ServerApp's own work after a round's replies (asynchronous mode: an
        aggregation): ``updates`` updates of ``values`` values combined, then the model
        scored on ``eval_samples`` held-out samples; charged on the clock by the
        :class:`ServerCost` model. Synchronous rounds' streams go on arriving meanwhile;
        asynchronous devices go on training (their messages are sent after it).

        Returns
        -------
        float
            The virtual seconds charged.
        """
        seconds = self.server_cost.seconds(updates, values, eval_samples)
        self.clock += seconds
        self.server_s += seconds
        if self.round_times and not self.asynchronous:
            self.round_times[-1] += seconds
        if not self.asynchronous:
            for stream in self.streams.values():
                stream.advance_to(self.clock)
        return seconds

    def _context(self, node: int, dev: VirtualDevice) -> Context:
        """The Context a device's ClientApp is called with."""
        node_config = NodeConfig(
            dev.device_id,
            str(self.stores[node].path),
            inject=dev.inject,
            model_dir=dev.model_dir,
            drift=dev.drift,
            agent=dev.agent,
        )
        return Context(
            run_id=1,
            node_id=node,
            node_config=node_config.to_node_config(),
            state=RecordDict(),
            run_config=self._run_config,
        )

    def _charge(
        self, reply: records.DeviceReply, dev: VirtualDevice, wait_s: float
    ) -> records.ReplyMetrics:
        """The reply's timings on the virtual clock: compute (the step-time model's, when
        given) times the device's slowdown, the virtual wait, and no scoring (the clock
        charges none, and the controller would take its wall seconds).

        With a step-time model each of the round's steps is drawn from it: the round costs
        their sum and the device reports their median past the first (as the trainer
        measures it), so a noisy model is as noisy per step as it says, no more per round.
        A spread round's two step sizes are each charged and reported the same way.
        """
        m = reply.metrics
        step_s, compute_s = m.step_s, m.compute_s
        timings = m.timings() if m.step_batches else []
        if self.step_time is not None and m.batch_size > 0:
            # the round's step sizes, as the trainer chose them (a spread round: two sizes)
            low = min(b for b, _ in timings) if timings else m.batch_size
            sizes = step_sizes(m.batch_size, max(1, m.local_steps), 1 - low / m.batch_size)
            steps = [(b, self.step_time(b)) for b in sizes]
            timed = steps[1:] or steps
            compute_s = sum(t for _, t in steps)
            timings = [
                (b, float(statistics.median(t for size, t in timed if size == b)))
                for b, _ in timings
            ]
            step_s = (
                statistics.fmean(t for _, t in timings)
                if timings
                else float(statistics.median(t for _, t in timed))
            )
        return replace(
            m,
            step_s=step_s * dev.slowdown,
            compute_s=compute_s * dev.slowdown,
            wait_s=wait_s,
            eval_s=0.0,
            step_times=[t * dev.slowdown for _, t in timings] or None,
        )

    def _deliver_injections(self) -> None:
        """Play the broker: each opted-in device's outbox to every other opted-in pool."""
        for node, outbox in self.outboxes.items():
            queued = outbox.pending(limit=10**6)
            if not queued:
                continue
            outbox.ack([i for i, _ in queued])
            if node not in self.pools:
                continue  # not opted in: its daemon would not publish (and it never queues)
            for other, pool in self.pools.items():
                if other != node:
                    payloads = [p for _, p in queued]
                    self.inject_rejected += receive(
                        pool,
                        payloads,
                        self.devices[other].device_id,
                        self.settings.learning.num_classes,
                        0.0,
                    )
                    self.inject_delivered += len(payloads)

    def close(self) -> None:
        """Close the buffer files."""
        for store in [*self.stores.values(), *self.pools.values()]:
            store.close()
        for outbox in self.outboxes.values():
            outbox.close()
