"""Readings of one or more topics onto one time base: rows of every channel, and breaks.

With one topic and no rate, each reading is a row as it comes; two readings further apart
than ``max_gap`` put a break between them.

With a rate (always with several topics) the rows lie on a grid, ``k / rate`` seconds since
the epoch, and each channel's value at a tick is interpolated linearly between its topic's
readings either side of it. A tick is emitted once every topic has a reading at or after it,
so a topic that runs behind (a slower network path, a clock a little late) holds the rows
back: skew is absorbed. The rules for readings that are missing or late:

- a tick whose readings either side, in some topic, are more than ``max_gap`` apart (or that
  precedes a topic's first reading) is a break: no window spans it;
- a topic more than ``max_skew`` seconds behind the newest reading of any other stops
  holding the rows back: the ticks it has not reached become breaks, and its readings that
  come later than ``max_gap`` before the next tick are refused as ``clock-skew``.

A reading not newer than its topic's newest is a redelivery when its timestamp is one of the
topic's recent ones (``duplicate``), and refused as ``late`` otherwise.

With ``hold`` (sensors that report only when a value changes: Zigbee2MQTT, Home Assistant)
a channel's value at a tick is its topic's last reading at or before it (held), for up to
``max_gap`` after that reading (past it, a break: the sensor may be gone); a tick is made once
any topic's newest reading is past it and every topic has reported once (a topic that
never has holds the rows back: :attr:`Aligner.waiting`). Silence is then no loss: nothing is
counted missing.

The aligner also counts readings that never arrived (:attr:`Aligner.missing`). Where readings
carry the sensor's counter (a sequence number), a jump of the counter between two readings
taken in turn is that many missing, however long the gap (a counter that goes back is the
sensor restarting it: counted from there). Without one, and with a rate: where two consecutive
readings of a topic lie ``k`` of its intervals apart (``k >= 1.5``, and no further apart than
``max_gap``: beyond it the stream may have paused, which cannot be told from a loss),
``round(k) - 1`` readings are missing. A topic's interval is the grid's, or its own median one
where it is slower (a topic sampled below the grid's rate is not short of readings), known
after a topic's first few readings; one sampled faster than the grid is counted on the grid's
interval, so its losses are undercounted, never invented.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from typing import Any

from edge_client.runtime.constants import DEDUP_WINDOW, RECENT_TIMESTAMPS

__all__ = ["Aligner", "Row"]

#: Readings of a topic before its interval is known, and holes in it are counted.
_KNOWN_INTERVAL = 8

#: A row: its time and every channel's value; None in a list of rows is a break.
Row = tuple[float, tuple[float, ...]]


class Aligner:
    """Merge topics' readings into rows (see the module notes for the rules).

    Parameters
    ----------
    channels : sequence of int
        Channels per topic, in the order their values are concatenated.
    rate : float, optional
        Ticks per second; None passes a single topic's readings through.
    max_gap, max_skew : float
        Seconds, as in the module notes.
    hold : bool
        Hold each topic's last value between its readings (report-on-change sensors);
        needs a rate.
    """

    def __init__(
        self,
        channels: tuple[int, ...],
        rate: float | None,
        max_gap: float,
        max_skew: float,
        hold: bool = False,
    ) -> None:
        if rate is None and len(channels) != 1:
            raise ValueError("several topics need a rate to be aligned")
        if hold and rate is None:
            raise ValueError("holding values between reports needs a rate (the grid)")
        self.channels = channels
        self.rate = rate
        self.max_gap = max_gap
        self.max_skew = max_skew
        self.hold = hold
        n = len(channels)
        self.newest: list[float | None] = [None] * n
        self.recent: list[deque[float]] = [deque(maxlen=RECENT_TIMESTAMPS) for _ in range(n)]
        # Resampling: each topic's readings from the one before the next tick on.
        self.pending: list[list[Row]] = [[] for _ in range(n)]
        self.next_k: int | None = None
        self._out: list[Row | None] = []
        self.missing = 0  # readings missing inside streams (a counter: the caller resets it)
        self.last_seq: list[int | None] = [None] * n  # each topic's last counter taken

    # -- input ----------------------------------------------------------------------------

    def add(
        self, topic: int, ts: float, values: tuple[float, ...], seq: int | None = None
    ) -> str | None:
        """Take one reading of topic ``topic`` (``seq``: the sensor's counter, if it sends
        one); return why it was refused, or None.

        Returns
        -------
        str or None
            ``duplicate``, ``late`` or ``clock-skew`` when refused.
        """
        newest = self.newest[topic]
        if newest is not None and ts <= newest:
            return "duplicate" if ts in self.recent[topic] else "late"
        k, rate = self.next_k, self.rate
        if k is not None and rate is not None and ts < k / rate - self.max_gap:
            return "clock-skew"  # behind ticks already given up on for it
        last = self.last_seq[topic]
        if seq is not None:
            if last is not None and seq > last:  # lower: the sensor restarted its counter
                self.missing += min(seq - last - 1, DEDUP_WINDOW)  # bounded: hostile numbers
            self.last_seq[topic] = seq
        elif self.hold:
            pass  # a report-on-change sensor's silence is no loss
        elif newest is not None and rate is not None and ts - newest <= self.max_gap:
            self.missing += self._missing(topic, ts - newest, 1.0 / rate)
        self.newest[topic] = ts
        self.recent[topic].append(ts)
        if self.rate is None:
            if newest is not None and ts - newest > self.max_gap:
                self._out.append(None)
            self._out.append((ts, values))
        else:
            self.pending[topic].append((ts, values))
        return None

    def fill(self, topic: int, values: tuple[float, ...]) -> tuple[float, ...] | None:
        """``values`` with its channels the sensor had no value for (NaN) held at the
        topic's last reading: with ``hold`` only (a report-on-change sensor's channel keeps
        its value until it reports another); None where there is nothing to hold."""
        if not self.hold or not self.pending[topic]:
            return None
        last = self.pending[topic][-1][1]
        return tuple(held if math.isnan(v) else v for v, held in zip(values, last, strict=True))

    def _missing(self, topic: int, gap: float, tick: float) -> int:
        """Readings missing in a ``gap`` (s) between two consecutive readings of ``topic``."""
        recent = self.recent[topic]
        if gap < 1.5 * tick or len(recent) < _KNOWN_INTERVAL:
            return 0  # on time, or the topic's own interval is not known yet
        gaps = [b - a for a, b in zip(recent, list(recent)[1:], strict=False)]
        tick = max(tick, statistics.median(gaps))  # the topic's own, where slower than the grid
        return max(0, round(gap / tick) - 1)

    # -- output ---------------------------------------------------------------------------

    def rows(self) -> list[Row | None]:
        """The rows (and breaks) that are final now, oldest first; each is given once."""
        if self.rate is not None:
            if self.hold:
                self._hold(self.rate)
            else:
                self._resample(self.rate)
        out, self._out = self._out, []
        return out

    @property
    def waiting(self) -> list[int]:
        """Topics that have never reported (with ``hold`` they hold the rows back)."""
        return [i for i, ts in enumerate(self.newest) if ts is None]

    def _hold(self, rate: float) -> None:
        """Ticks up to the newest reading of any topic, each topic's value held from its last
        reading at or before the tick, for up to ``max_gap``."""
        if self.waiting:
            return
        lead = max(ts for ts in self.newest if ts is not None)
        if self.next_k is None:
            self.next_k = math.ceil(max(p[0][0] for p in self.pending) * rate)
        # Strictly before the newest reading: another topic's report stamped at that same
        # instant may still come, and belongs in the tick.
        while self.next_k / rate < lead:
            t = self.next_k / rate
            row: list[float] = []
            resume = t  # past a topic's expired hold: its next reading, where values resume
            for readings in self.pending:
                j = bisect.bisect_right(readings, t, key=lambda r: r[0])  # first after t
                if j == 0 or t - readings[j - 1][0] > self.max_gap:
                    resume = max(resume, readings[j][0] if j < len(readings) else math.inf)
                else:
                    row.extend(readings[j - 1][1])
            if resume == t:
                self._out.append((t, tuple(row)))
                self.next_k += 1
            else:  # one break, and on to where every topic has a value again
                self._break()
                if math.isinf(resume):
                    self.next_k = math.floor(lead * rate) + 1
                else:
                    self.next_k = max(self.next_k + 1, math.ceil(resume * rate))
            self._prune(self.next_k / rate)

    def _resample(self, rate: float) -> None:
        if self.next_k is None:  # the grid starts once every topic has begun (or skew says so)
            firsts = [p[0][0] for p in self.pending if p]
            if not firsts:
                return
            lead = max(ts for ts in self.newest if ts is not None)
            if len(firsts) < len(self.pending) and lead - min(firsts) <= self.max_skew:
                return
            self.next_k = math.ceil(min(firsts) * rate)
        while True:
            t = self.next_k / rate
            behind = [i for i, ts in enumerate(self.newest) if ts is None or ts < t]
            if behind:
                lead = max(ts for ts in self.newest if ts is not None)
                give_up = lead - self.max_skew
                if give_up < t:
                    return  # wait for the topics behind: within the skew tolerance
                # Beyond it: every tick up to give_up lacks a reading of those topics.
                self._break()
                self.next_k = max(self.next_k + 1, math.floor(give_up * rate) + 1)
                self._prune(self.next_k / rate)
                continue
            row: list[float] = []
            resume = t  # the first time every topic has a value again, across gaps
            for i in range(len(self.channels)):
                at = self._at(i, t)
                if isinstance(at, tuple):
                    row.extend(at)
                else:
                    resume = max(resume, at)
            if resume == t:
                self._out.append((t, tuple(row)))
                self.next_k += 1
            else:  # no tick before ``resume`` has every topic's value: one break, skip them
                self._break()
                self.next_k = max(self.next_k + 1, math.ceil(resume * rate))
            self._prune(self.next_k / rate)

    def _at(self, topic: int, t: float) -> tuple[float, ...] | float:
        """The topic's values at ``t``, interpolated; or, across a gap (or before its first
        reading), the time of the reading after it, where the topic has values again."""
        readings = self.pending[topic]
        j = bisect.bisect_left(readings, t, key=lambda r: r[0])  # first at or after t
        after = readings[j]
        if after[0] == t:
            return after[1]
        if j == 0:
            return after[0]
        before = readings[j - 1]
        span = after[0] - before[0]
        if span > self.max_gap:
            return after[0]
        w = (t - before[0]) / span
        return tuple(a + w * (b - a) for a, b in zip(before[1], after[1], strict=True))

    def _prune(self, t: float) -> None:
        """Drop readings no tick from ``t`` on needs (keep the last one before it)."""
        for readings in self.pending:
            j = bisect.bisect_left(readings, t, key=lambda r: r[0])
            if j > 1:
                del readings[: j - 1]

    def _break(self) -> None:
        if self._out and self._out[-1] is None:
            return
        self._out.append(None)

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a restart needs, JSON-ready (rows already given are not in it)."""
        return {
            "newest": self.newest,
            "recent": [list(r) for r in self.recent],
            "pending": [[[ts, list(v)] for ts, v in p] for p in self.pending],
            "next-k": self.next_k,
            "last-seq": self.last_seq,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self.newest = list(state["newest"])
        self.recent = [deque(r, maxlen=RECENT_TIMESTAMPS) for r in state["recent"]]
        self.pending = [[(ts, tuple(v)) for ts, v in p] for p in state["pending"]]
        self.next_k = state["next-k"]
        self.last_seq = list(state.get("last-seq") or [None] * len(self.channels))
