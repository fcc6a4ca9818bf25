"""Per-reading messages in, labelled windows out: decode, align, window, join labels.

The ingest writer gives each batch of messages to :meth:`WindowAssembler.feed` and commits
what comes back in one transaction with the samples: the windows ready to store, the
windows that wait for a label (kept in the buffer file's ``held_windows``), and the
assembler's state (readings of unfinished windows included) in the file's meta. A message
is acknowledged only after that commit, so readings waiting in an unfinished window outlive
a ``kill -9`` like stored samples do, and a redelivered reading is known by its timestamp.

If the commit fails, the caller throws the assembler away and loads it again from the file
(:meth:`WindowAssembler.load`): its memory never runs ahead of what is committed.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import paho.mqtt.client as mqtt

from edge_client.runtime.constants import ARRIVAL_STEP_S, MAX_AHEAD_S, WINDOWING_META
from edge_client.runtime.windowing.align import Aligner
from edge_client.runtime.windowing.labels import LabelJoin
from edge_client.runtime.windowing.spec import WindowSpec
from edge_client.runtime.windowing.windows import Windower
from edge_client.wire.constants import NO_LABEL
from edge_client.wire.frames import Arrivals, FrameError
from edge_client.wire.readings import MissingValueError, Reading, decode_readings
from edge_client.wire.sparkplug import SparkplugReader

__all__ = ["Assembled", "WindowAssembler"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: (topic, payload, arrival time) of one message, as the ingest writer hands them over.
Message = tuple[str, bytes | bytearray, float]


@dataclass
class Assembled:
    """What one :meth:`WindowAssembler.feed` made, to commit in one transaction.

    Attributes
    ----------
    x, y, ts : ndarray
        Windows to store now, ``(n, channels, window)``, their labels and end times.
    hold : list of (int, float, ndarray)
        New windows waiting for a label: id, end time, values.
    release : list of int
        Held windows leaving the file (stored above, or dropped).
    counts : Counter
        Counter deltas: ``readings``, ``readings-at-gaps``, ``readings-missing``,
        ``duplicates`` (readings), ``windows-dropped:<reason>``.
    rejected : Counter
        Messages refused whole, and single readings refused, by reason.
    state : str
        The assembler's state after this batch (JSON).
    rebirth : str, optional
        Sparkplug B with ``--sparkplug-rebirth``: the edge node's ``NCMD`` topic, to ask it
        for its births (data is held for aliases none has named).
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    hold: list[tuple[int, float, npt.NDArray[np.float32]]] = field(default_factory=list)
    release: list[int] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    state: str = ""
    rebirth: str | None = None

    def arrivals(self) -> Arrivals:
        """The windows to store now, as the buffer store takes them (one message's worth,
        without a publisher: a redelivered reading was dropped already)."""
        n = len(self.y)
        return Arrivals(
            x=self.x,
            y=self.y,
            ts=self.ts,
            counts=[n] if n else [],
            publishers=[None] if n else [],
            seqs=[0] if n else [],
        )

    def save(self, db: sqlite3.Connection) -> None:
        """Write the held windows and the state (inside the caller's transaction)."""
        db.executemany("DELETE FROM held_windows WHERE id = ?", [(i,) for i in self.release])
        db.executemany(
            "INSERT INTO held_windows (id, ts, x) VALUES (?, ?, ?)",
            [(i, end, x.astype("<f4").tobytes()) for i, end, x in self.hold],
        )
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (WINDOWING_META, self.state))


class WindowAssembler:
    """Turn per-reading messages into samples (see the package notes for the rules).

    Parameters
    ----------
    spec : WindowSpec
        Topics, channels, window, stride, gaps, rate, labels.
    """

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.aligner = Aligner(
            tuple(s.channels for s in spec.streams),
            spec.rate,
            spec.max_gap,
            spec.max_skew,
            hold=spec.hold,
        )
        self.windower = Windower(spec.window, spec.stride)
        self.labels = LabelJoin(spec.label_wait) if spec.labelled else None
        self.held: dict[int, npt.NDArray[np.float32]] = {}
        self.next_id = 0
        self.now: float | None = None  # the newest reading's time
        self.horizon: float | None = None  # the newest row's: later windows end after it
        self.stale: list[int] = []  # held windows of other settings, to drop on the next feed
        topic = spec.sparkplug
        #: Sparkplug B: the edge node's births, deaths and sequence (None for other payloads).
        self.sparkplug = (
            None
            if topic is None
            else SparkplugReader(topic, [s.format.fields[0].text for s in spec.streams])
        )

    # -- persistence ----------------------------------------------------------------------

    @classmethod
    def load(cls, spec: WindowSpec, db: sqlite3.Connection) -> WindowAssembler:
        """The assembler as last committed in a buffer file (new if none was, or if it was
        made for other topics, channels, rate or window: then it starts afresh)."""
        assembler = cls(spec)
        row = db.execute("SELECT value FROM meta WHERE key = ?", (WINDOWING_META,)).fetchone()
        if row is None:
            return assembler
        state = json.loads(row[0])
        if state.get("spec") != spec.fingerprint():
            stale = [int(i) for (i,) in db.execute("SELECT id FROM held_windows")]
            log.warning(
                "the buffer was windowed with other settings (%s): starting afresh, dropping "
                "%d reading(s) of an unfinished window and %d window(s) waiting for a label",
                state.get("spec"),
                len(state.get("windower", {}).get("rows", [])),
                len(stale),
            )
            assembler.stale = stale
            assembler.next_id = max(stale, default=-1) + 1
            return assembler
        assembler.aligner.restore(state["aligner"])
        assembler.windower.restore(state["windower"])
        if assembler.labels is not None and state.get("labels") is not None:
            assembler.labels.restore(state["labels"])
            rows = db.execute("SELECT id, x FROM held_windows").fetchall()
            assembler.held = {
                int(i): np.frombuffer(x, "<f4").reshape(spec.shape).copy() for i, x in rows
            }
        if assembler.sparkplug is not None and state.get("sparkplug") is not None:
            assembler.sparkplug.restore(state["sparkplug"])
        assembler.next_id = int(state["next-id"])
        assembler.now = state["now"]
        assembler.horizon = state["horizon"]
        return assembler

    def state(self) -> str:
        """The state :meth:`load` continues from, as JSON."""
        return json.dumps(
            {
                "spec": self.spec.fingerprint(),
                "aligner": self.aligner.state(),
                "windower": self.windower.state(),
                "labels": None if self.labels is None else self.labels.state(),
                "next-id": self.next_id,
                "now": self.now,
                "horizon": self.horizon,
                # what `fedstream status` says of the stream's times (not for a restart)
                "stamped-on-arrival": [
                    s.topic for s in self.spec.streams if s.format.time_field is None
                ],
                "never-reported": [self.spec.streams[i].key for i in self.aligner.waiting],
                **(
                    {}
                    if self.sparkplug is None
                    else {
                        "sparkplug": self.sparkplug.state(),
                        "sparkplug-status": self.sparkplug.status,
                    }
                ),
            }
        )

    # -- the work -------------------------------------------------------------------------

    def feed(self, messages: Sequence[Message]) -> Assembled:
        """Take a batch of messages, in arrival order; return what to commit.

        Messages on a topic that is none of the spec's are refused as ``bad-topic``.
        """
        counts: Counter[str] = Counter()
        rejected: Counter[str] = Counter()
        ready: list[tuple[float, npt.NDArray[np.float32], int]] = []
        hold: list[tuple[int, float, npt.NDArray[np.float32]]] = []
        release: list[int] = []
        if self.stale:
            release.extend(self.stale)
            counts["windows-dropped:reconfigured"] += len(self.stale)
            self.stale = []
        for topic, payload, arrival in messages:
            self._take(topic, payload, arrival, counts, rejected)
            rows = self.aligner.rows()
            self.horizon = next((r[0] for r in reversed(rows) if r is not None), self.horizon)
            windows = self.windower.feed(rows)
            if self.windower.given_up:
                counts["readings-at-gaps"] += self.windower.given_up
                self.windower.given_up = 0
            if self.aligner.missing:
                counts["readings-missing"] += self.aligner.missing
                self.aligner.missing = 0
            for end, x in windows:
                if self.labels is None:
                    ready.append((end, x, NO_LABEL))
                    continue
                self.held[self.next_id] = x
                self.labels.hold(self.next_id, end)
                hold.append((self.next_id, end, x))
                self.next_id += 1
            if self.labels is not None and self.now is not None:
                labelled, dropped, reasons = self.labels.resolve(self.now, self.horizon)
                for window_id, end, label in labelled:
                    ready.append((end, self.held.pop(window_id), label))
                for window_id in dropped:
                    self.held.pop(window_id)
                counts.update({f"windows-dropped:{r}": n for r, n in reasons.items()})
                release.extend(i for i, _, _ in labelled)
                release.extend(dropped)
        # A window held and released within this batch never needs to reach the file.
        held_now, released_now = {h[0] for h in hold}, set(release)
        hold = [h for h in hold if h[0] not in released_now]
        release = [i for i in release if i not in held_now]
        shape = self.spec.shape
        rebirth = None
        reader = self.sparkplug
        if reader is not None and self.spec.rebirth and reader.rebirth_due(time.monotonic()):
            rebirth = reader.topic.command_topic()
        return Assembled(
            x=np.stack([x for _, x, _ in ready]) if ready else np.empty((0, *shape), np.float32),
            y=np.array([y for _, _, y in ready], dtype=np.int64),
            ts=np.array([t for t, _, _ in ready], dtype=np.float64),
            hold=hold,
            release=release,
            counts=counts,
            rejected=rejected,
            state=self.state(),
            rebirth=rebirth,
        )

    def arrival_stamped(self, topic: str) -> bool:
        """Whether ``topic``'s readings are stamped on arrival (no timestamp field): then a
        retained message, delivered on subscribing, is no fresh reading."""
        return self.sparkplug is None and any(
            s.format.time_field is None
            for s in self.spec.streams
            if mqtt.topic_matches_sub(s.topic, topic)
        )

    def _stamped(self, index: int, readings: list[Reading]) -> list[Reading]:
        """Arrival-stamped readings of topic ``index``, made strictly rising: a burst (one
        arrival time for many) or a clock step back must not make them duplicates or late."""
        newest = self.aligner.newest[index]
        out = []
        for reading in readings:
            ts = reading.ts if newest is None else max(reading.ts, newest + ARRIVAL_STEP_S)
            out.append(replace(reading, ts=ts))
            newest = ts
        return out

    def _take(
        self,
        topic: str,
        payload: bytes | bytearray,
        arrival: float,
        counts: Counter[str],
        rejected: Counter[str],
    ) -> None:
        """Decode one message and give its readings to the aligner and the label join.

        A reading stamped more than :data:`~edge_client.runtime.constants.MAX_AHEAD_S` ahead
        of its arrival is refused as ``bad-timestamp`` (a unit mix-up, milliseconds read as
        seconds, would otherwise put the topic's clock centuries ahead and make every later
        reading ``late``)."""
        spec = self.spec
        if self.sparkplug is not None:
            self._take_sparkplug(topic, payload, arrival, counts, rejected)
            return
        if spec.label_topic is not None and mqtt.topic_matches_sub(spec.label_topic.topic, topic):
            fmt = spec.label_topic.format
            index = None
        else:
            index = next(
                (i for i, s in enumerate(spec.streams) if mqtt.topic_matches_sub(s.topic, topic)),
                None,
            )
            if index is None:
                rejected["bad-topic"] += 1
                return
            fmt = spec.streams[index].format
        readings = _decoded(lambda: decode_readings(payload, fmt, arrival), counts, rejected)
        if readings is None:
            return
        if fmt.time_field is None and index is not None:
            readings = self._stamped(index, readings)
        for reading in readings:
            self._add(index, reading, arrival, counts, rejected)

    def _take_sparkplug(
        self,
        topic: str,
        payload: bytes | bytearray,
        arrival: float,
        counts: Counter[str],
        rejected: Counter[str],
    ) -> None:
        """One message of the Sparkplug B edge node: its metrics' readings, each on its own
        channel's stream (a metric's timestamp is its own)."""
        reader = self.sparkplug
        assert reader is not None
        taken = _decoded(lambda: reader.take(topic, payload, arrival), counts, rejected)
        if taken is None:
            return
        readings, seen = taken
        counts.update(seen)
        for index, reading in readings:
            self._add(index, reading, arrival, counts, rejected)

    def _add(
        self,
        index: int | None,
        reading: Reading,
        arrival: float,
        counts: Counter[str],
        rejected: Counter[str],
    ) -> None:
        """Give one reading to stream ``index``'s aligner (None: to the label join)."""
        if reading.ts > arrival + MAX_AHEAD_S:
            rejected["bad-timestamp"] += 1
            return
        if index is not None and any(math.isnan(v) for v in reading.values):
            held = self.aligner.fill(index, reading.values)  # some channels unavailable
            if held is None:
                counts["readings-unavailable"] += 1
                return
            reading = replace(reading, values=held)
        if index is None:  # a label event
            assert self.labels is not None and reading.label is not None
            reason = self.labels.add(reading.ts, reading.label)
        else:
            reason = self.aligner.add(index, reading.ts, reading.values, reading.seq)
            if reason is None:
                counts["readings"] += 1
                self.now = reading.ts if self.now is None else max(self.now, reading.ts)
                if reading.label is not None and self.labels is not None:
                    self.labels.add(reading.ts, reading.label)
        if reason == "duplicate":
            counts["duplicates"] += 1
        elif reason is not None:
            rejected[reason] += 1


def _decoded(decode: Callable[[], _T], counts: Counter[str], rejected: Counter[str]) -> _T | None:
    """What ``decode`` makes of a message, or None where it takes nothing: the sensor said
    it has no value (counted, no error), the message is refused (by reason), or the decoder
    failed (a bug must not stop ingest: logged, counted as ``decode-error``)."""
    try:
        return decode()
    except MissingValueError:
        counts["readings-unavailable"] += 1
    except FrameError as err:
        rejected[err.reason] += 1
    except Exception:
        log.exception("unexpected error decoding a message")
        rejected["decode-error"] += 1
    return None
