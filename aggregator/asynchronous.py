"""Asynchronous mode (``mode = "async"``): no device waits for the slowest.

Every live node has one training message out at a time. As soon as a reply arrives it is
read and checked as in synchronous mode
(:meth:`~aggregator.strategy.StreamStrategy.read_update`: refusals and failures counted, the
controller fed the step time), its update goes into FedBuff's buffer
(:class:`~aggregator.fedbuff.UpdateBuffer`: staleness-weighted, ``too-stale``,
``duplicate`` and ``bad-version`` refused), and the node is sent new work from the newest
model version. When ``async-buffer`` updates are buffered they are applied as one step: a new
model version, evaluated on ``eval-data`` when the run has it, checkpointed with the
buffer's state, and recorded (one :class:`~aggregator.round_log.RoundRecord` per version, with
each update's staleness). ``num-rounds`` counts versions (0: until stopped; a stop request
is honoured after the next aggregation).

What stays as in synchronous mode, per version instead of per round: the batch controller's
plan (its batches equalise the devices' step times, so updates come at an even rate; the
ScaDLES cap takes each device's own cycle as its horizon), the codec mode and error feedback,
who shares samples for injection. A message without a reply after ``round-timeout`` seconds
counts as a failure of its device; a node whose last message brought nothing usable (no reply
in time, an error, a refusal, no samples trained) is sent work again with the next version,
not at once, so that a device that cannot train does not spin through messages. If nothing
usable comes from any device for ``round-timeout`` seconds, a warning names the failures and
refusals and the devices keep being asked (as synchronous rounds without updates would go
on); on a virtual clock, where nothing would change, the run ends with that error. A device
that comes back on a new node id (a SuperNode restarted) is sent work as soon as its node is
listed.

On a grid with a virtual clock (the in-process runner) each device runs on its own clock and
a pull returns the reply that arrives first on it, so updates are applied in order of their
virtual arrival; ``virtual-s`` is then the virtual time between aggregations (on Flower's
engines, the wall time).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.serverapp import Grid

from aggregator.divergence import RunDivergedError
from aggregator.exchange import PULL_BATCH, PULL_INTERVAL_S, wait_for_nodes
from aggregator.fedbuff import UpdateBuffer
from aggregator.round_log import RoundRecord, UpdateInfo, divergence_hint, virtual_round_s
from aggregator.session import RECORDS_KEPT, RunSession, is_virtual, virtual_time
from aggregator.strategy import RoundReport

__all__ = ["FEDBUFF_STATE", "default_buffer_size", "run_async"]

log = logging.getLogger(__name__)

#: Key of the buffer's state (version, update ids remembered) in a checkpoint.
FEDBUFF_STATE = "fedbuff"


@dataclass(frozen=True)
class _Dispatch:
    """A training message out: to which node, from which version, with which batch."""

    node: int
    device: str  # as the fleet knew the node then
    version: int
    planned: int
    sent_at: float  # time.monotonic()


def default_buffer_size(nodes: int) -> int:
    """``async-buffer = 0``: half the devices connected at the start (at least one), so that
    the model moves about twice per cycle of an average device."""
    return max(1, nodes // 2)


def run_async(
    grid: Grid, session: RunSession, stop: Callable[[RoundRecord], bool] | None = None
) -> list[RoundRecord]:
    """Train asynchronously until ``num-rounds`` versions are made (or ``stop`` says so);
    return the records of the aggregations made.

    Raises
    ------
    RuntimeError
        If no node is connected for ``round-timeout`` seconds, or, on a virtual clock, none
        sent an update that could be used for that long (every reply an error, a refusal or
        empty).
    RunDivergedError
        After ``max-diverged-rounds`` versions in a row in which training diverged on some
        device, or when no update could be used for ``round-timeout`` seconds because
        training diverged.
    """
    if not session.more_rounds(session.start):
        return []
    return _AsyncLoop(grid, session, stop).run()


class _AsyncLoop:
    """One asynchronous run: the messages out, the buffer, and the version being built."""

    def __init__(
        self, grid: Grid, session: RunSession, stop: Callable[[RoundRecord], bool] | None
    ) -> None:
        s = self.settings = session.settings
        self.grid, self.session, self.stop = grid, session, stop
        self.strategy = session.strategy
        wait_for_nodes(grid, s.exchange.min_nodes, s.exchange.round_timeout)
        nodes = self.strategy.fleet.live_nodes(grid.get_node_ids())
        shapes = {k: tuple(a.shape) for k, a in session.arrays.items()}
        size = s.asynchrony.async_buffer or default_buffer_size(len(nodes))
        self.buffer = UpdateBuffer.from_settings(
            s.asynchrony,
            shapes,
            size,
            session.start - 1,
            s.aggregation_rule,
            self.strategy.heterogeneity,
        )
        if FEDBUFF_STATE in session.saved:
            self.buffer.load_state_dict(session.saved[FEDBUFF_STATE])
        log.info(
            "asynchronous training from version %d: %d updates per aggregation, staleness %s",
            self.buffer.version,
            size,
            s.asynchrony.staleness,
        )
        self.virtual = is_virtual(grid)
        self.arrays = session.arrays
        self.in_flight: dict[str, _Dispatch] = {}
        # Nodes whose last reply brought nothing usable (an error, a refusal, no samples, no
        # reply in time) get work again with the next version, not at once: a device that
        # cannot train must not spin through messages.
        self.held: set[int] = set()
        self.records: deque[RoundRecord] = deque(maxlen=RECORDS_KEPT)
        self.strategy.plan_async(self.arrays, self.buffer.version, nodes)
        self.report = self.strategy.async_report()
        self.since_wall, self.since_clock = time.monotonic(), virtual_time(grid)
        self.last_update = time.monotonic()

    def run(self) -> list[RoundRecord]:
        s = self.settings
        while True:
            live = self.strategy.fleet.live_nodes(self.grid.get_node_ids())
            if not live and not self.in_flight:
                # Raises when none comes back.
                wait_for_nodes(self.grid, 1, s.exchange.round_timeout)
                continue
            self._dispatch(live)
            replies = _pull(self.grid, list(self.in_flight), self.virtual)
            for reply in replies:
                if self._take(reply) and self.buffer.full:
                    self._aggregate(live)
                    if self.session.finished(self.records[-1], self.stop):
                        return list(self.records)
            self._expire()
            if time.monotonic() - self.last_update > s.exchange.round_timeout:
                self._stalled()
            if not replies:
                time.sleep(PULL_INTERVAL_S)

    def _stalled(self) -> None:
        """No usable update for ``round-timeout`` seconds. When training diverged on devices
        meanwhile (and ``max-diverged-rounds`` is not 0), the run ends as diverged: no
        version is made to count it by. On a virtual clock nothing will change (the same
        devices answer the same way at no cost in time): the run ends with an error. On
        Flower's engines it is what a synchronous round without updates would be (a broker
        outage, starved streams): logged, and the devices keep being asked."""
        s, fleet = self.settings, self.strategy.fleet
        why = (
            f"no usable update for {s.exchange.round_timeout:.0f} s (round-timeout): failures "
            f"{dict(fleet.failed)}, refusals {dict(fleet.rejected_reasons)}"
        )
        diverged = self.report.diverged  # since the last version: no version will count them
        if diverged and s.rounds.max_diverged_rounds:
            hint = divergence_hint(s.learning.lr)
            raise RunDivergedError(f"{why}; training diverged on {', '.join(diverged)}: {hint}")
        if self.virtual:
            raise RuntimeError(why)
        log.warning("%s; still waiting at version %d", why, self.buffer.version)
        self.last_update = time.monotonic()

    def _dispatch(self, live: list[int]) -> None:
        """Send work from the newest version to every live node with none out."""
        busy = {d.node for d in self.in_flight.values()}
        idle = [n for n in live if n not in busy and n not in self.held]
        if not idle and not self.in_flight and self.held:  # all held: nothing else will come
            self.held.clear()
            time.sleep(PULL_INTERVAL_S)
            return
        if not idle:
            return
        version = self.buffer.version
        messages = [self.strategy.configure_async(n, self.arrays, version, live) for n in idle]
        ids = list(self.grid.push_messages(messages))
        now = time.monotonic()
        for message_id, node in zip(ids, idle, strict=True):
            self.in_flight[message_id] = _Dispatch(
                node,
                self.strategy.fleet.device_of(node),
                version,
                self.strategy.planned_batch(node),
                now,
            )

    def _take(self, reply: Message) -> bool:
        """Read one reply and buffer its update; return whether it was buffered."""
        message_id = reply.metadata.reply_to_message_id
        sent = self.in_flight.pop(message_id, None)
        if sent is None:
            log.warning("dropped a message that answers none pending: %r", message_id)
            return False
        strategy = self.strategy
        update = strategy.read_update(reply, sent.node, self.report, sent.planned, sent.device)
        if update is None:
            self.held.add(sent.node)
            return False
        m = update.metrics
        cycle = (
            virtual_round_s([m], self.settings.uplink_mbps)
            if self.virtual
            else time.monotonic() - sent.sent_at
        )
        strategy.record_cycle(update.device, cycle)
        if m.num_examples <= 0:  # trained nothing (an empty stream): nothing to buffer
            self.held.add(sent.node)
            return False
        boost = strategy.boost_of(update, self.report)
        why = self.buffer.add(
            message_id,
            update.device,
            sent.version,
            update.delta,
            strategy.weighed_samples(m, sent.planned),
            m.local_steps,
            boost=boost,
        )
        if why is not None:
            strategy.refuse(self.report, update.device, why)
            self.held.add(sent.node)
            return False
        self.last_update = time.monotonic()
        return True

    def _aggregate(self, live: list[int]) -> None:
        """Apply the buffer: a new version, evaluated, checkpointed and recorded."""
        new, made = self.buffer.apply({k: a.numpy() for k, a in self.arrays.items()})
        self.arrays = ArrayRecord({k: Array(v.astype(np.float32)) for k, v in new.items()})
        report = self.report
        report.aggregated = made.devices
        report.weight_ratio = made.ratio
        report.updates = [
            UpdateInfo(c.device, c.base_version, c.staleness, c.weight, c.num_examples)
            for c in made.contributions
        ]
        self.session.charge_server(self.grid, len(made.contributions))
        wall = time.monotonic() - self.since_wall
        virtual_s = virtual_time(self.grid) - self.since_clock if self.virtual else wall
        record = _aggregation_record(
            self.session, report, self.arrays, wall, virtual_s, len(self.in_flight)
        )
        state = {FEDBUFF_STATE: self.buffer.state_dict()}
        record = self.session.commit(record, self.arrays, **state)
        log.info(record.progress(self.session.settings.rounds.num_rounds))
        self.records.append(record)
        self.since_wall, self.since_clock = time.monotonic(), virtual_time(self.grid)
        self.held.clear()
        self.strategy.plan_async(self.arrays, self.buffer.version, live)
        self.report = self.strategy.async_report()

    def _expire(self) -> None:
        """Count a failure for each message without a reply after ``round-timeout``."""
        now = time.monotonic()
        for message_id, sent in list(self.in_flight.items()):
            if now - sent.sent_at > self.settings.exchange.round_timeout:
                del self.in_flight[message_id]
                self.strategy.fail(self.report, self.strategy.sender(sent.node, sent.device))
                self.held.add(sent.node)


def _aggregation_record(
    session: RunSession,
    report: RoundReport,
    arrays: ArrayRecord,
    wall: float,
    virtual_s: float,
    in_flight: int,
) -> RoundRecord:
    """Score the new version (on ``eval-data``) and make its record."""
    report.close()
    test = session.evaluate(arrays)
    record = session.record(report, test, wall, virtual_s, in_flight=in_flight)
    return record


def _pull(grid: Grid, ids: list[str], virtual: bool) -> list[Message]:
    """The replies that are in. A virtual-clock grid is asked about every message at once:
    it answers with the one that arrives first on its clock. Flower's grids are asked
    :data:`~aggregator.exchange.PULL_BATCH` ids at a time."""
    if not ids:
        return []
    if virtual:
        return list(grid.pull_messages(ids))
    replies: list[Message] = []
    for first in range(0, len(ids), PULL_BATCH):
        replies += grid.pull_messages(ids[first : first + PULL_BATCH])
    return replies
