"""Where a synchronous round's wall time went, from its line of ``metrics.jsonl``.

A round ends when its slowest reply is in, so the round's wall time is read along that
device's path (the *critical* device: the longest push-to-reply latency):

- ``flower``: Flower's share of that latency (the SuperNode's poll of the SuperLink,
  starting the ClientApp process, moving the messages), i.e. what is left of the latency
  after the device's own figures;
- ``start``: the ClientApp process from its start to the handler (imports, app load);
- ``setup``, ``stream-wait``, ``sampling``, ``evaluation``, ``training``, ``encoding``:
  the handler's parts (:class:`~edge_client.wire.records.ReplyMetrics`);
- ``handler-other``: the handler's time none of its parts measured;
- ``aggregator``: planning, what is left of the aggregation once the last reply is in,
  evaluation and checkpoint (:class:`~aggregator.round_log.RoundTiming`);
- ``other``: the round's wall time none of the above measured.

``flower`` also holds the wait for the aggregator's next pull (at most its 0.2 s
interval). The parts add up to the round's ``wall-s`` by construction (``other`` is the
remainder); each is measured on its own, and the tests check that the remainders
(``handler-other``, ``other``, a non-negative ``flower``) stay small.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from aggregator.round_log import RoundRecord

__all__ = ["PARTS", "round_breakdown", "run_breakdown"]

#: The parts of a round, in the order a round goes through them.
PARTS = (
    "aggregator",
    "flower",
    "start",
    "setup",
    "stream-wait",
    "sampling",
    "evaluation",
    "training",
    "encoding",
    "handler-other",
    "other",
)


def round_breakdown(record: RoundRecord) -> dict[str, float] | None:
    """Seconds of each of :data:`PARTS` in one synchronous round (they sum to
    ``wall-s``); None for a round without replies, timing or latencies (an asynchronous
    aggregation, a line from before the breakdown was recorded)."""
    timed = {d: s for d, s in record.latency.items() if d in record.devices}
    if record.mode != "sync" or not timed or record.timing.replies_s <= 0:
        return None
    device = max(timed, key=lambda d: timed[d])
    m = record.devices[device]
    if m.handler_s <= 0:  # a device of an older fedstream: no breakdown in its reply
        return None
    t = record.timing
    handler_parts = m.setup_s + m.wait_s + m.take_s + m.eval_s + m.train_s + m.encode_s
    parts = {
        "aggregator": t.plan_s + t.aggregate_s + t.eval_s + t.checkpoint_s + t.export_s,
        "flower": timed[device] - m.start_s - m.handler_s,
        "start": m.start_s,
        "setup": m.setup_s,
        "stream-wait": m.wait_s,
        "sampling": m.take_s,
        "evaluation": m.eval_s,
        "training": m.train_s,
        "encoding": m.encode_s,
        "handler-other": m.handler_s - handler_parts,
    }
    parts["other"] = record.wall_s - sum(parts.values())
    return parts


def run_breakdown(records: Sequence[RoundRecord]) -> dict[str, Any]:
    """The rounds' breakdowns together: each part's share of the summed wall time, the
    median round, and the share the devices spent training (their training steps and the
    prequential evaluation before them, along the critical path).

    Returns
    -------
    dict
        ``rounds`` (how many had a breakdown), ``round_wall_s`` (median), ``shares``
        (part -> fraction of wall time), ``seconds`` (part -> median seconds per round),
        ``training_share``; empty when no round had a breakdown.
    """
    broken = [(r, b) for r in records if (b := round_breakdown(r)) is not None]
    if not broken:
        return {}
    wall = sum(r.wall_s for r, _ in broken)
    shares = {p: round(sum(b[p] for _, b in broken) / wall, 4) for p in PARTS}
    return {
        "rounds": len(broken),
        "round_wall_s": round(statistics.median(r.wall_s for r, _ in broken), 3),
        "shares": shares,
        "seconds": {p: round(statistics.median(b[p] for _, b in broken), 3) for p in PARTS},
        "training_share": round(shares["training"] + shares["evaluation"], 4),
    }
