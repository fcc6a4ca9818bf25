"""Asynchronous mode (``mode = "async"``): no device waits for the slowest.

Every live node has one training message out at a time. As soon as a reply arrives it is
read and checked as in synchronous mode
(:meth:`~aggregator.strategy.StreamStrategy.read_update`: refusals and failures counted, the
controller fed the step time), its update goes into FedBuff's buffer
(:class:`~aggregator.fedbuff.UpdateBuffer`: staleness-weighted, ``too-stale``,
``duplicate`` and ``bad-version`` refused), and the node is sent new work from the newest
model version. When ``async-buffer`` updates are buffered they are applied as one step: a new
model version, evaluated on ``eval-data`` when the run has it, checkpointed with the
buffer's state, and recorded (one :class:`~aggregator.records.RoundRecord` per version, with
each update's staleness). ``num-rounds`` counts versions.

What stays as in synchronous mode, per version instead of per round: the batch controller's
plan (its batches equalise the devices' step times, so updates come at an even rate; the
ScaDLES cap takes each device's own cycle as its horizon), the codec mode and error feedback,
who shares samples for injection. A node whose message has no reply after
``round-timeout`` seconds counts as failed and is sent new work; a node that comes back under
a new id (a SuperNode restarted) is sent work as soon as it is listed.

On a grid with a virtual clock (the in-process runner) each device runs on its own clock and
a pull returns the reply that arrives first on it, so updates are applied in order of their
virtual arrival; ``virtual-s`` is then the virtual time between aggregations (on Flower's
engines, the wall time).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.serverapp import Grid

from aggregator.exchange import PULL_BATCH, PULL_INTERVAL_S, wait_for_nodes
from aggregator.fedbuff import UpdateBuffer
from aggregator.records import RoundRecord, UpdateInfo, virtual_round_s
from aggregator.session import RunSession, is_virtual
from aggregator.strategy import RoundReport

__all__ = ["FEDBUFF_STATE", "default_buffer_size", "run_async"]

log = logging.getLogger(__name__)

#: Key of the buffer's state (version, update ids remembered) in a checkpoint.
FEDBUFF_STATE = "fedbuff"


@dataclass(frozen=True)
class _Dispatch:
    """A training message out: to which node, from which version, with which batch."""

    node: int
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
        If no node is connected for ``round-timeout`` seconds.
    """
    s = session.settings
    strategy = session.strategy
    records: list[RoundRecord] = []
    if session.start > s.num_rounds:
        return records
    wait_for_nodes(grid, s.min_nodes, s.round_timeout)
    nodes = strategy.fleet.live_nodes(grid.get_node_ids())
    shapes = {k: tuple(a.shape) for k, a in session.arrays.items()}
    size = s.async_buffer or default_buffer_size(len(nodes))
    buffer = UpdateBuffer.from_settings(s, shapes, size, version=session.start - 1)
    if FEDBUFF_STATE in session.saved:
        buffer.load_state_dict(session.saved[FEDBUFF_STATE])
    log.info(
        "asynchronous training from version %d: %d updates per aggregation, staleness %s",
        buffer.version,
        size,
        s.staleness,
    )
    virtual = is_virtual(grid)
    arrays = session.arrays
    in_flight: dict[str, _Dispatch] = {}
    strategy.plan_async(arrays, buffer.version, nodes)
    report = strategy.async_report()
    since_wall, since_clock = time.monotonic(), _clock(grid)
    while True:
        live = strategy.fleet.live_nodes(grid.get_node_ids())
        if not live and not in_flight:
            wait_for_nodes(grid, 1, s.round_timeout)  # raises when none comes back
            continue
        busy = {d.node for d in in_flight.values()}
        idle = [n for n in live if n not in busy]
        if idle:
            messages = [strategy.configure_async(n, arrays, buffer.version, live) for n in idle]
            ids = list(grid.push_messages(messages))
            now = time.monotonic()
            for message_id, node in zip(ids, idle, strict=True):
                in_flight[message_id] = _Dispatch(
                    node, buffer.version, strategy.planned_batch(node), now
                )
        replies = _pull(grid, list(in_flight), virtual)
        for reply in replies:
            message_id = reply.metadata.reply_to_message_id
            sent = in_flight.pop(message_id, None)
            if sent is None:
                log.warning("dropped a message that answers none pending: %r", message_id)
                continue
            update = strategy.read_update(reply, sent.node, report, sent.planned)
            if update is None:
                continue
            m = update.metrics
            cycle = (
                virtual_round_s([m], s.uplink_mbps) if virtual else time.monotonic() - sent.sent_at
            )
            strategy.record_cycle(update.device, cycle)
            if m.num_examples <= 0:
                continue  # trained nothing (an empty stream): nothing to buffer
            why = buffer.add(
                message_id, update.device, sent.version, update.delta, m.num_examples, m.local_steps
            )
            if why is not None:
                strategy.refuse(report, update.device, why)
                continue
            if not buffer.full:
                continue
            new, made = buffer.apply({k: a.numpy() for k, a in arrays.items()})
            arrays = ArrayRecord({k: Array(v.astype(np.float32)) for k, v in new.items()})
            report.aggregated = made.devices
            report.updates = [
                UpdateInfo(c.device, c.base_version, c.staleness, c.weight, c.num_examples)
                for c in made.contributions
            ]
            wall = time.monotonic() - since_wall
            virtual_s = _clock(grid) - since_clock if virtual else wall
            record = _aggregation_record(session, report, arrays, wall, virtual_s, len(in_flight))
            session.commit(record, arrays, **{FEDBUFF_STATE: buffer.state_dict()})
            records.append(record)
            since_wall, since_clock = time.monotonic(), _clock(grid)
            if buffer.version >= s.num_rounds or (stop is not None and stop(record)):
                return records
            strategy.plan_async(arrays, buffer.version, live)
            report = strategy.async_report()
        now = time.monotonic()
        for message_id, sent in list(in_flight.items()):  # no reply in time: a failure
            if now - sent.sent_at > s.round_timeout:
                del in_flight[message_id]
                strategy.fail(report, strategy.fleet.device_of(sent.node))
        if not replies:
            time.sleep(PULL_INTERVAL_S)


def _aggregation_record(
    session: RunSession,
    report: RoundReport,
    arrays: ArrayRecord,
    wall: float,
    virtual_s: float,
    in_flight: int,
) -> RoundRecord:
    """Score the new version (on ``eval-data``), log it, and make its record."""
    report.close()
    test = session.evaluate(arrays)
    record = session.record(report, test, wall, virtual_s, in_flight=in_flight)
    staleness = [u.staleness for u in record.updates]
    log.info(
        "version %d: %s %.3f (prequential, %d samples)%s, %d updates from %s, staleness %s",
        record.round,
        record.metric,
        record.accuracy,
        record.eval_count,
        "" if test is None else f", {record.test_accuracy:.3f} on eval-data",
        len(record.updates),
        ", ".join(sorted(set(record.aggregated))),
        "/".join(map(str, staleness)),
    )
    return record


def _clock(grid: Grid) -> float:
    """The grid's virtual time (0 on a wall-clock grid)."""
    return float(getattr(grid, "clock", 0.0))


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
