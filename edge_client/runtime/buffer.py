"""The buffer store: one SQLite file (WAL mode) per device, between ingest and training.

The ingest daemon appends decoded messages in batched transactions; the ClientApp, another
process, takes samples with :meth:`BufferStore.take`. Both use ``BEGIN IMMEDIATE`` so that a
take never sees half an append, and WAL lets ``fedstream status`` read while they write.

Samples are stored one row per message ("chunk") with the features as a blob, so that
64-sample messages cost one row. A chunk is consumed or evicted from its front by moving its
``start`` offset. Counters (all in samples unless named otherwise):

``messages``   MQTT messages handled (accepted, duplicate or rejected)
``received``   samples in valid, non-duplicate messages
``accepted``   samples stored
``dropped``    samples discarded by the policy (at arrival or by eviction)
``duplicates`` messages dropped as QoS 1 redeliveries
``messages-missing`` messages of fedstream publishers that never arrived: gaps in their
               sequence numbers (a late arrival takes its number off; in messages)
``rejected``   messages refused as malformed (``rejected:<reason>`` per reason)
``consumed``   samples taken by training
``fill``       samples in the buffer now (= accepted - evicted - consumed)

Windowing a per-reading stream (:mod:`edge_client.runtime.windowing`) counts in readings
instead: ``messages`` and ``rejected`` (messages refused whole, readings refused one by one),
``duplicates`` (redelivered readings), ``readings`` (taken into windows), ``readings-at-gaps``
(given up at a gap before they filled a window), ``readings-missing`` (missing inside a
stream at the declared rate: what a broker dropped), ``readings-unavailable`` (messages whose
value said the sensor had none: ``unavailable``, ``null``), ``retained-skipped`` (retained
messages of topics stamped on arrival: the broker's old copy, no fresh reading); samples are
windows, and ``windows-dropped:<reason>`` counts windows that never got a label.
``stamped-on-arrival`` names the topics whose readings carry no time of their own,
``never-reported`` those that have sent no reading yet (no window is made without them).
A Sparkplug B stream adds ``sparkplug-lost`` (its edge node's messages missing by sequence
number) and ``sparkplug``: the edge node and device online or not (births and deaths), the
metrics its birth named, data held for aliases not yet named, and the counts of
:data:`SPARKPLUG_COUNTS`.

Policies: ``truncation`` keeps the newest ``capacity`` samples and evicts the oldest;
``persistence`` keeps everything until consumed and drops the newest arrivals once full.

The file also holds the device's state between rounds and its outbox, in tables of their
own (:mod:`edge_client.runtime.schema`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_client.runtime.constants import (
    CHUNK_MAX_SAMPLES,
    DRIFT_STATUS_KEY,
    POLICIES,
    POLICY_PERSISTENCE,
    POLICY_TRUNCATION,
    WINDOWING_META,
)
from edge_client.runtime.dedup import SeqWindow
from edge_client.runtime.schema import BufferStoreError, SqliteStore, transaction
from edge_client.wire.frames import Arrivals, SampleBatch

__all__ = [
    "COUNTERS",
    "AppendResult",
    "BufferStore",
    "BufferStoreError",
    "SampleBuffer",
    "sample_bytes",
]

log = logging.getLogger(__name__)

COUNTERS = (
    "messages",
    "received",
    "accepted",
    "dropped",
    "duplicates",
    "rejected",
    "consumed",
    "messages-missing",
)
#: A Sparkplug B stream's counters, ``sparkplug-<name>``: messages lost (sequence gaps),
#: out of order (behind the sequence: redelivered or late), held for unknown aliases, held
#: and dropped (past the bound), births and deaths seen.
SPARKPLUG_COUNTS = ("lost", "out-of-order", "held", "held-dropped", "births", "deaths")


class SampleBuffer(Protocol):
    """What training needs of a buffer: a :class:`BufferStore`, or a simulated device's
    :class:`~edge_client.emulation.lazy_buffer.LazyBuffer`."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        ...

    @property
    def fill(self) -> int:
        """Samples held now."""
        ...

    @property
    def arriving(self) -> bool:
        """Whether samples can arrive while a round waits for them (a virtual device's
        buffer, frozen at its round's virtual time, cannot: training takes what it holds)."""
        ...

    def take(self, n: int, *, hold: bool = False) -> SampleBatch:
        """Remove and return up to ``n`` of the oldest samples (with ``hold``: kept aside
        until :meth:`settle_taken`, put back by :meth:`restore_taken`)."""
        ...

    def settle_taken(self) -> None:
        """The held samples are spent (their round's reply is ready): forget them."""
        ...

    def restore_taken(self) -> int:
        """Put held samples back, oldest first (their round died); return how many."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters, fill, rate and configuration (kebab-case keys)."""
        ...


def sample_bytes(shape: Sequence[int]) -> int:
    """Bytes one sample of ``shape`` takes in a buffer: float32 features, label, timestamp."""
    return 4 * math.prod(shape) + 16


_RESERVED_META = frozenset(
    {"shape", "created", "policy", "capacity", "capacity-bytes", "rate", "rate-updated"}
    | {WINDOWING_META}
)


@dataclass(frozen=True)
class AppendResult:
    """What one :meth:`BufferStore.append` did, in samples (duplicates in messages)."""

    received: int
    accepted: int
    dropped: int
    duplicates: int


class BufferStore(SqliteStore):
    """A device's durable, bounded sample buffer.

    Parameters
    ----------
    path : str or Path
        The SQLite file. Created when ``shape`` is given and the file does not exist.
    shape : sequence of int, optional
        Per-sample feature shape. Required to create a buffer; checked against the stored
        shape when opening an existing one.
    policy : {"truncation", "persistence"}, optional
        Overflow policy; stored in the file. Defaults to the stored one (or truncation).
    capacity : int, optional
        Maximum samples held; stored in the file.
    capacity_bytes : int, optional
        Also bound the buffer by feature+label+timestamp bytes; the tighter bound wins.

    Raises
    ------
    BufferStoreError
        If the file does not exist and no shape is given, or the configuration conflicts.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        shape: Sequence[int] | None = None,
        policy: str | None = None,
        capacity: int | None = None,
        capacity_bytes: int | None = None,
    ) -> None:
        if policy is not None and policy not in POLICIES:
            raise BufferStoreError(f"policy must be one of {POLICIES}, got {policy!r}")
        if capacity is not None and capacity < 1:
            raise BufferStoreError(f"capacity must be >= 1 sample, got {capacity}")
        if capacity_bytes is not None and capacity_bytes < 1:
            raise BufferStoreError(f"capacity-bytes must be >= 1, got {capacity_bytes}")
        settle = functools.partial(self._settle, shape, policy, capacity, capacity_bytes)
        super().__init__(path, create=shape is not None, initialise=settle)
        try:
            with self._write() as db:
                meta = settle(db)
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise BufferStoreError(f"{self.path} is not a fedstream buffer: {err}") from err
        except BufferStoreError:
            self._db.close()
            raise
        self.shape: tuple[int, ...] = tuple(json.loads(meta["shape"]))
        self.policy: str = meta["policy"]
        self.sample_bytes = sample_bytes(self.shape)
        cap = int(meta["capacity"])
        if "capacity-bytes" in meta:
            cap = min(cap, int(meta["capacity-bytes"]) // self.sample_bytes)
        self.capacity: int = max(cap, 1)

    # -- set-up ---------------------------------------------------------------------------

    def _settle(
        self,
        shape: Sequence[int] | None,
        policy: str | None,
        capacity: int | None,
        capacity_bytes: int | None,
        db: sqlite3.Connection,
    ) -> dict[str, str]:
        """The file's configuration, with what was asked for written in (inside the caller's
        transaction); a reader that asks for nothing writes nothing (full disks)."""
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        stored_meta = dict(meta)
        if "shape" not in meta:
            if shape is None:
                raise BufferStoreError(f"{self.path} is not an initialised fedstream buffer")
            meta["shape"] = json.dumps([int(d) for d in shape])
            meta["created"] = repr(time.time())
        stored = tuple(json.loads(meta["shape"]))
        if shape is not None and tuple(int(d) for d in shape) != stored:
            raise BufferStoreError(
                f"{self.path} holds samples of shape {stored}, not {tuple(shape)}"
            )
        if policy is not None:
            meta["policy"] = policy
        meta.setdefault("policy", POLICY_TRUNCATION)
        if capacity is not None:
            meta["capacity"] = str(capacity)
        meta.setdefault("capacity", str(2**62))
        if capacity_bytes is not None:
            meta["capacity-bytes"] = str(capacity_bytes)
        if meta != stored_meta:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        return meta

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

    # -- ingest side ----------------------------------------------------------------------

    def append(
        self,
        arrivals: Arrivals | Sequence[SampleBatch],
        *,
        rejected: Mapping[str, int] | None = None,
        messages: int | None = None,
        rate: float | None = None,
        counts: Mapping[str, int] | None = None,
        also: Callable[[sqlite3.Connection], None] | None = None,
    ) -> AppendResult:
        """Store decoded messages in one transaction, applying de-duplication and the policy.

        Parameters
        ----------
        arrivals : Arrivals or sequence of SampleBatch
            Decoded messages in arrival order. One whose ``(publisher, seq)`` was stored
            before is a redelivery and is skipped (:class:`~edge_client.runtime.dedup.SeqWindow`,
            kept in the file: ``publishers.last_seq`` is its floor, ``seen_ahead`` its bitmap).
        rejected : mapping of str to int, optional
            Messages refused by the decoder, by reason, to count in the same transaction.
        messages : int, optional
            Messages handled (defaults to ``len(arrivals) + sum(rejected)``).
        rate : float, optional
            Current stream-rate estimate to publish in the file.
        counts : mapping of str to int, optional
            More counter deltas to add in the same transaction.
        also : callable, optional
            More writes to commit in the same transaction (the windowing state: see
            :meth:`~edge_client.runtime.windowing.Assembled.save`).

        Returns
        -------
        AppendResult
        """
        if not isinstance(arrivals, Arrivals):
            arrivals = Arrivals.from_batches(arrivals, self.shape)
        rejected = rejected or {}
        n_rejected = sum(rejected.values())
        received = accepted = dropped = duplicates = 0
        keep: list[list[int]] = []  # [start, stop) ranges of the concatenated samples
        with self._write() as db:
            fill = self._counter(db, "fill")
            windows: dict[str, SeqWindow] = {}
            missing_before = 0  # of the publishers met in this transaction
            start = 0
            for n, publisher, seq in zip(
                arrivals.counts, arrivals.publishers, arrivals.seqs, strict=True
            ):
                at, start = start, start + n
                if publisher is not None:
                    window = windows.get(publisher)
                    if window is None:
                        window = windows[publisher] = self._window(db, publisher, seq)
                        missing_before += window.missing
                    if window.seen(seq):
                        duplicates += 1
                        continue
                    window.add(seq)
                received += n
                lo, hi = 0, n
                if self.policy == POLICY_PERSISTENCE:
                    hi = max(0, min(n, self.capacity - fill))  # drop the newest once full
                else:
                    lo = max(0, n - self.capacity)  # a message bigger than the buffer
                kept = hi - lo
                dropped += n - kept
                if kept:
                    if keep and keep[-1][1] == at + lo:
                        keep[-1][1] = at + hi  # contiguous with the previous message
                    else:
                        keep.append([at + lo, at + hi])
                    fill += kept
                    accepted += kept
            db.executemany(
                "INSERT INTO chunks (n, ts, y, x) VALUES (?, ?, ?, ?)", _rows(arrivals, keep)
            )
            evicted = 0
            if self.policy == POLICY_TRUNCATION and fill > self.capacity:
                evicted = self._evict_oldest(db, fill - self.capacity)
                fill -= evicted
                dropped += evicted
            self._save_windows(db, windows)
            deltas = {
                "messages": len(arrivals) + n_rejected if messages is None else messages,
                "received": received,
                "accepted": accepted,
                "dropped": dropped,
                "duplicates": duplicates,
                "rejected": n_rejected,
                "fill": accepted - evicted,
                "messages-missing": sum(w.missing for w in windows.values()) - missing_before,
            }
            deltas.update({f"rejected:{k}": v for k, v in rejected.items()})
            for name, n in (counts or {}).items():
                deltas[name] = deltas.get(name, 0) + n
            self._add(db, deltas)
            if also is not None:
                also(db)
            if rate is not None:
                db.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [("rate", repr(float(rate))), ("rate-updated", repr(time.time()))],
                )
        return AppendResult(received, accepted, dropped, duplicates)

    def count_discarded(self, n: int) -> None:
        """Count ``n`` samples that arrived and that the policy discarded without storing
        them (an emulated stream skips generating what a full buffer would drop)."""
        with self._write() as db:
            self._add(db, {"received": n, "dropped": n})

    @staticmethod
    def _window(db: sqlite3.Connection, publisher: str, seq: int) -> SeqWindow:
        """The publisher's de-duplication window as stored (new: starting at ``seq``)."""
        row = db.execute(
            "SELECT last_seq, bits, low, high, lost FROM publishers "
            "LEFT JOIN seen_ahead USING (publisher) WHERE publisher = ?",
            (publisher,),
        ).fetchone()
        return SeqWindow.starting_at(seq) if row is None else SeqWindow.from_stored(*row)

    @staticmethod
    def _save_windows(db: sqlite3.Connection, windows: Mapping[str, SeqWindow]) -> None:
        db.executemany(
            "INSERT INTO publishers (publisher, last_seq, low, high, lost) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(publisher) DO UPDATE SET last_seq = excluded.last_seq, "
            "low = excluded.low, high = excluded.high, lost = excluded.lost",
            [(p, w.floor, w.low, w.high, w.lost) for p, w in windows.items()],
        )
        ahead = [(p, w.to_bytes()) for p, w in windows.items()]
        db.executemany(  # an in-order stream has nothing ahead: usually no row at all
            "DELETE FROM seen_ahead WHERE publisher = ?", [(p,) for p, b in ahead if not b]
        )
        db.executemany(
            "INSERT OR REPLACE INTO seen_ahead VALUES (?, ?)", [a for a in ahead if a[1]]
        )

    def _evict_oldest(self, db: sqlite3.Connection, excess: int) -> int:
        evicted = 0
        last_whole: int | None = None
        partial: tuple[int, int] | None = None
        cur = db.execute("SELECT id, n, start FROM chunks ORDER BY id")
        for chunk_id, n, start in cur:
            avail = n - start
            if avail <= excess - evicted:
                last_whole = chunk_id
                evicted += avail
            else:
                partial = (start + excess - evicted, chunk_id)
                evicted = excess
            if evicted >= excess:
                break
        cur.close()
        if last_whole is not None:
            db.execute("DELETE FROM chunks WHERE id <= ?", (last_whole,))
        if partial is not None:
            db.execute("UPDATE chunks SET start = ? WHERE id = ?", partial)
        return evicted

    # -- training side --------------------------------------------------------------------

    def held_aside(self) -> int:
        """Samples a round has taken and holds aside now (:meth:`take` with ``hold``): more
        than 0 while a round trains, until its reply is ready."""
        row = self._db.execute("SELECT coalesce(sum(n), 0) FROM taken").fetchone()
        return int(row[0])

    def settle_taken(self) -> None:
        """Forget the samples held by :meth:`take` (``hold=True``): their round is done."""
        with self._write() as db:
            db.execute("DELETE FROM taken")

    def restore_taken(self) -> int:
        """Put the samples a round took and never settled back into the buffer, ahead of
        everything else (they are the oldest), and uncount their consumption; past the
        capacity of a truncation buffer the oldest go, counted as dropped.

        Returns
        -------
        int
            Samples put back (0 when the last round settled, the usual case).
        """
        with self._write() as db:
            rows = db.execute("SELECT n, ts, y, x FROM taken ORDER BY id").fetchall()
            if not rows:
                return 0
            first = db.execute("SELECT min(id) FROM chunks").fetchone()[0]
            low = min(int(first if first is not None else 1), 1) - len(rows)
            db.executemany(
                "INSERT INTO chunks (id, n, ts, y, x) VALUES (?, ?, ?, ?, ?)",
                [(low + i, *row) for i, row in enumerate(rows)],
            )
            db.execute("DELETE FROM taken")
            back = sum(int(r[0]) for r in rows)
            fill = self._counter(db, "fill") + back
            evicted = 0
            if self.policy == POLICY_TRUNCATION and fill > self.capacity:
                evicted = self._evict_oldest(db, fill - self.capacity)
            self._add(db, {"consumed": -back, "fill": back - evicted, "dropped": evicted})
        log.warning(
            "%s: put back %d samples a round took and never finished (its trainer stopped)",
            self.path,
            back,
        )
        return back

    def take(self, n: int, *, hold: bool = False) -> SampleBatch:
        """Atomically remove and return up to ``n`` of the oldest samples.

        Parameters
        ----------
        n : int
            Samples wanted; fewer are returned when fewer are buffered.
        hold : bool
            Keep them aside in the same transaction until :meth:`settle_taken` (the round
            that trains on them has its reply), so that a trainer killed mid-round loses
            none: :meth:`restore_taken` puts them back.

        Returns
        -------
        SampleBatch
            ``x`` of shape ``(k, *shape)`` with ``k <= n``, oldest first.
        """
        if n < 0:
            raise ValueError(f"cannot take {n} samples")
        per = math.prod(self.shape)
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        tss: list[np.ndarray] = []
        got = 0
        with self._write() as db:
            last_whole: int | None = None
            partial: tuple[int, int] | None = None
            cur = db.execute("SELECT id, n, start, ts, y, x FROM chunks ORDER BY id")
            while got < n:
                row = cur.fetchone()
                if row is None:
                    break
                chunk_id, count, start, ts, y, x = row
                use = min(count - start, n - got)
                tss.append(np.frombuffer(ts, "<f8")[start : start + use])
                ys.append(np.frombuffer(y, "<i8")[start : start + use])
                xs.append(np.frombuffer(x, "<f4")[start * per : (start + use) * per])
                got += use
                if start + use == count:
                    last_whole = chunk_id
                else:
                    partial = (start + use, chunk_id)
            cur.close()
            if last_whole is not None:
                db.execute("DELETE FROM chunks WHERE id <= ?", (last_whole,))
            if partial is not None:
                db.execute("UPDATE chunks SET start = ? WHERE id = ?", partial)
            if got:
                self._add(db, {"consumed": got, "fill": -got})
                if hold:
                    db.execute(
                        "INSERT INTO taken (n, ts, y, x) VALUES (?, ?, ?, ?)",
                        (got, *(b"".join(a.tobytes() for a in arr) for arr in (tss, ys, xs))),
                    )
        if not got:
            return SampleBatch(
                x=np.empty((0, *self.shape), np.float32),
                y=np.empty(0, np.int64),
                ts=np.empty(0, np.float64),
            )
        return SampleBatch(
            x=np.concatenate(xs).reshape(got, *self.shape).astype(np.float32),
            y=np.concatenate(ys).astype(np.int64),
            ts=np.concatenate(tss).astype(np.float64),
        )

    def sample(self, n: int, rng: np.random.Generator) -> SampleBatch:
        """``n`` samples drawn at random *without consuming them* (the injection pool is a
        small shared reservoir reused across rounds); with replacement only if ``n`` exceeds
        what is held."""
        rows = self._db.execute("SELECT n, start, ts, y, x FROM chunks ORDER BY id").fetchall()
        per = math.prod(self.shape)
        if n <= 0 or not rows:
            return SampleBatch(
                x=np.empty((0, *self.shape), np.float32),
                y=np.empty(0, np.int64),
                ts=np.empty(0, np.float64),
            )
        ts = np.concatenate([np.frombuffer(r[2], "<f8")[r[1] :] for r in rows])
        y = np.concatenate([np.frombuffer(r[3], "<i8")[r[1] :] for r in rows])
        x = np.concatenate([np.frombuffer(r[4], "<f4")[r[1] * per :] for r in rows])
        idx = rng.choice(len(y), size=n, replace=n > len(y))
        return SampleBatch(
            x=x.reshape(len(y), *self.shape)[idx].astype(np.float32),
            y=y[idx].astype(np.int64),
            ts=ts[idx].astype(np.float64),
        )

    # -- observation ------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """A value of the file's key/value metadata (for tools built on the store)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a metadata value (keys of the store itself are refused)."""
        if key in _RESERVED_META:
            raise ValueError(f"meta key {key!r} belongs to the buffer store")
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    @property
    def fill(self) -> int:
        """Samples buffered now."""
        return self._counter(self._db, "fill")

    @property
    def arriving(self) -> bool:
        """True: the ingest daemon goes on appending while a round waits."""
        return True

    def stats(self) -> dict[str, Any]:
        """Counters, fill, rate and configuration as one JSON-ready dict (kebab-case keys)."""
        self._db.execute("BEGIN")
        try:
            counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            drift = self._db.execute(
                "SELECT value FROM state WHERE key = ?", (DRIFT_STATUS_KEY,)
            ).fetchone()
        finally:
            self._db.execute("COMMIT")
        out: dict[str, Any] = {name: int(counters.get(name, 0)) for name in COUNTERS}
        out["fill"] = int(counters.get("fill", 0))
        out["rejected-by-reason"] = _by_reason(counters, "rejected")
        if "readings" in counters:  # a per-reading stream, windowed on ingest
            out["windows-dropped-by-reason"] = _by_reason(counters, "windows-dropped")
            out["readings"] = int(counters["readings"])
            out["readings-at-gaps"] = int(counters.get("readings-at-gaps", 0))
            out["readings-missing"] = int(counters.get("readings-missing", 0))
            out["readings-unavailable"] = int(counters.get("readings-unavailable", 0))
            out["retained-skipped"] = int(counters.get("retained-skipped", 0))
            windowing = json.loads(meta.get(WINDOWING_META) or "{}")
            out["stamped-on-arrival"] = windowing.get("stamped-on-arrival", [])
            out["never-reported"] = windowing.get("never-reported", [])
            if "sparkplug-status" in windowing:  # a Sparkplug B edge node's data topic
                out["sparkplug-lost"] = int(counters.get("sparkplug-lost", 0))
                out["sparkplug"] = {
                    **windowing["sparkplug-status"],
                    **{n: int(counters.get(f"sparkplug-{n}", 0)) for n in SPARKPLUG_COUNTS},
                }
            out["windows-held"] = int(
                self._db.execute("SELECT count(*) FROM held_windows").fetchone()[0]
            )
        updated = float(meta.get("rate-updated", 0.0))
        out["rate"] = float(meta.get("rate", 0.0))
        out["rate-age-s"] = round(time.time() - updated, 3) if updated else None
        out["capacity"] = self.capacity
        out["fill-fraction"] = out["fill"] / self.capacity
        out["fill-bytes"] = out["fill"] * self.sample_bytes
        out["policy"] = self.policy
        out["shape"] = list(self.shape)
        out["path"] = str(self.path)
        if drift is not None:  # a drift watcher runs on this device (fedstream infer, ClientApp)
            try:
                out["drift"] = json.loads(bytes(drift[0]))
            except ValueError:
                out["drift"] = None
        return out

    # -- helpers --------------------------------------------------------------------------

    @staticmethod
    def _counter(db: sqlite3.Connection, name: str) -> int:
        row = db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _add(db: sqlite3.Connection, deltas: Mapping[str, int]) -> None:
        db.executemany(
            "INSERT INTO counters VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            [(k, v) for k, v in deltas.items() if v],
        )


def _by_reason(counters: Mapping[str, int], family: str) -> dict[str, int]:
    """The ``<family>:<reason>`` counters as ``{reason: count}``."""
    prefix = f"{family}:"
    return {k[len(prefix) :]: int(v) for k, v in sorted(counters.items()) if k.startswith(prefix)}


def _rows(arrivals: Arrivals, keep: list[list[int]]) -> Iterator[tuple[int, Any, Any, Any]]:
    """Chunk rows for the kept ranges, at most :data:`CHUNK_MAX_SAMPLES` samples each.

    Rows span messages (one row per transaction, not per message, keeps SQLite's per-row
    cost off the 1-sample-message path); the cap keeps a partial take cheap.
    """
    for lo, hi in keep:
        for a in range(lo, hi, CHUNK_MAX_SAMPLES):
            b = min(a + CHUNK_MAX_SAMPLES, hi)
            yield (
                b - a,
                _blob(arrivals.ts[a:b], "<f8"),
                _blob(arrivals.y[a:b], "<i8"),
                _blob(arrivals.x[a:b], "<f4"),
            )


def _blob(a: np.ndarray, dtype: str) -> memoryview:
    """The array's bytes, little endian, without a copy when it already is."""
    contiguous: Any = np.ascontiguousarray(a, dtype=dtype)
    return memoryview(contiguous).cast("B")
