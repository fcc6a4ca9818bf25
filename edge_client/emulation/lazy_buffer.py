"""A virtual device's buffer kept as counts: the simulation engine's lazy replay.

A replayed stream's samples are addressable by index (:class:`StreamSamples` of the
synthetic task, :class:`RecordingSamples` of a device's part of a recording: sample ``i`` is
the same whoever asks, and whenever), so a virtual device need not store what its stream
delivered. :class:`LazyBuffer` keeps what a real buffer's policy would hold as ranges of
stream indices and its counters (received, accepted, dropped, consumed, messages), a few
hundred bytes, and materialises samples only when a round takes them. Its counts, and the
samples it hands out, are those of the eager replay into a :class:`BufferStore`
(:func:`edge_client.emulation.replay.replay_into`) for the same seed, sample for sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from edge_client.emulation.sources import SyntheticSource, label_distribution
from edge_client.emulation.virtual_stream import arrived
from edge_client.runtime.buffer import COUNTERS, sample_bytes
from edge_client.runtime.constants import POLICY_PERSISTENCE, POLICY_TRUNCATION
from edge_client.runtime.seeding import device_rng
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch

__all__ = ["CHUNK", "LazyBuffer", "RecordingSamples", "Samples", "StreamSamples"]

#: Samples drawn per seed stream: sample ``i`` comes from chunk ``i // CHUNK``.
CHUNK = 256
_SKEW_STREAM = 1_000_003  # seed stream of a device's label mix and feature shift
_CHUNK_STREAM = 2_000_000  # first seed stream of the chunks


class Samples(Protocol):
    """A device's stream by index: sample ``i`` is the same whoever asks, and whenever."""

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape."""
        ...

    def range(self, start: int, stop: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Samples ``start`` to ``stop - 1``: ``(x, y)``."""
        ...


@dataclass(frozen=True, eq=False)
class RecordingSamples:
    """A device's part of a recording as its stream: the part's samples in recorded order,
    starting over when it ends (sample ``i`` is the part's ``i mod len``).

    Parameters
    ----------
    x, y : ndarray
        The part's samples and labels, in the order the device streams them.
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        if len(self.y) == 0 or len(self.x) != len(self.y):
            raise ValueError(f"a part needs samples: got {len(self.x)} and {len(self.y)} labels")

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape."""
        return tuple(int(d) for d in self.x.shape[1:])

    def range(self, start: int, stop: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Samples ``start`` to ``stop - 1`` of the stream: ``(x, y)``."""
        at = np.arange(start, max(start, stop)) % len(self.y)
        return self.x[at].astype(np.float32), self.y[at].astype(np.int64)

    def passes(self, delivered: int) -> float:
        """How many times over the stream has delivered the part."""
        return delivered / len(self.y)


@dataclass(frozen=True)
class StreamSamples:
    """The samples of one device's replayed synthetic stream, by index.

    Parameters
    ----------
    device_id : str
        Seeds the stream (with ``seed``).
    seed : int
        The run's seed.
    shape, num_classes
        The synthetic task's sample shape and classes.
    labels, dirichlet, feature_shift
        The device's skew, as the publisher's ``--classes``, ``--dirichlet`` and
        ``--feature-shift`` (fixed per device and seed).
    """

    device_id: str
    seed: int
    shape: tuple[int, ...]
    num_classes: int
    labels: Sequence[int] | None = None
    dirichlet: float | None = None
    feature_shift: float = 0.0

    def range(self, start: int, stop: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Samples ``start`` to ``stop - 1`` of the stream: ``(x, y)``."""
        if stop <= start:
            return np.empty((0, *self.shape), np.float32), np.empty(0, np.int64)
        task = SensorTask(self.shape, self.num_classes)
        skew = device_rng(self.seed, self.device_id, _SKEW_STREAM)
        probs = label_distribution(task.num_classes, skew, self.labels, self.dirichlet)
        shift = None
        if self.feature_shift:
            shift_rng = device_rng(self.seed, self.device_id, _SKEW_STREAM + 1)
            shift = task.device_shift(shift_rng, self.feature_shift)
        xs, ys = [], []
        first, last = start // CHUNK, (stop - 1) // CHUNK
        for chunk in range(first, last + 1):
            rng = device_rng(self.seed, self.device_id, _CHUNK_STREAM + chunk)
            source = SyntheticSource(task, rng, probs)
            source.shift = shift
            x, y = source.next(CHUNK)
            lo = max(start - chunk * CHUNK, 0)
            hi = min(stop - chunk * CHUNK, CHUNK)
            xs.append(x[lo:hi])
            ys.append(y[lo:hi])
        return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


@dataclass
class LazyBuffer:
    """What a buffer of ``capacity`` under ``policy`` holds of a replayed stream, as counts.

    Parameters
    ----------
    samples : Samples
        The stream: the synthetic task's, or a part of a recording.
    rate : float
        Samples per second.
    capacity : int
        The buffer's capacity.
    policy : str
        ``truncation`` (the newest are kept) or ``persistence`` (the newest are refused).
    initial : int
        Samples delivered when the stream starts (the first :meth:`advance`).
    """

    samples: Samples
    rate: float
    capacity: int
    policy: str = POLICY_TRUNCATION
    initial: int = 0
    start: float | None = None
    delivered: int = 0
    #: Held samples, oldest first: ``[first index, stop index, arrival time]``.
    held: list[list[float]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    rate_updated: float = 0.0
    #: With a clock (``time.time``), :attr:`fill` first takes in what arrived by then, as a
    #: real buffer fills while a round waits; without, only :meth:`advance` delivers.
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if self.policy not in (POLICY_TRUNCATION, POLICY_PERSISTENCE):
            raise ValueError(f"unknown buffer policy {self.policy!r}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")

    @property
    def arriving(self) -> bool:
        """Whether :attr:`fill` grows while a round waits: only with a clock."""
        return self.clock is not None

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        return self.samples.shape

    @property
    def fill(self) -> int:
        """Samples held now (arrivals by the clock's time taken in first, with a clock)."""
        if self.clock is not None:
            self.advance(self.clock())
        return self._held()

    def _held(self) -> int:
        return int(sum(b - a for a, b, _ in self.held))

    def advance(self, now: float | None = None) -> int:
        """Deliver what the stream sent up to ``now`` (wall clock by default) as the policy
        would store it, generating nothing; return how many samples arrived."""
        now = time.time() if now is None else now
        if self.start is None:
            self.start = now
        due = arrived(self.rate, now - self.start, self.initial) - self.delivered
        if due <= 0:
            return 0
        first = self.delivered
        self.delivered += due
        fill = self._held()
        if self.policy == POLICY_PERSISTENCE:
            kept = max(0, min(due, self.capacity - fill))
            lo, hi = first, first + kept
        else:
            kept = min(due, self.capacity)
            lo, hi = first + due - kept, first + due
        c = self.counters
        c["received"] += due
        c["dropped"] += due - kept
        if kept:
            c["messages"] += 1
            c["accepted"] += kept
            self.held.append([lo, hi, now])
            excess = fill + kept - self.capacity
            if self.policy == POLICY_TRUNCATION and excess > 0:
                self._drop_oldest(excess)
                c["dropped"] += excess
        self.rate_updated = time.time()
        return due

    def _drop_oldest(self, n: int) -> list[list[float]]:
        """Remove the ``n`` oldest held samples; return the ranges they were."""
        gone: list[list[float]] = []
        while n > 0 and self.held:
            a, b, at = self.held[0]
            use = min(n, int(b - a))
            gone.append([a, a + use, at])
            if a + use == b:
                self.held.pop(0)
            else:
                self.held[0][0] = a + use
            n -= use
        return gone

    def settle_taken(self) -> None:
        """Nothing is held: a virtual device's round is not killed half-way."""

    def restore_taken(self) -> int:
        """Nothing is held (:meth:`settle_taken`)."""
        return 0

    def take(self, n: int, *, hold: bool = False) -> SampleBatch:
        """Remove and return up to ``n`` of the oldest samples (generated now; ``hold`` is
        for a real buffer's trainer, which may die)."""
        if n < 0:
            raise ValueError(f"cannot take {n} samples")
        ranges = self._drop_oldest(n)
        xs, ys, tss = [], [], []
        for a, b, at in ranges:
            x, y = self.samples.range(int(a), int(b))
            xs.append(x)
            ys.append(y)
            tss.append(np.full(len(y), at, np.float64))
        got = int(sum(len(y) for y in ys))
        self.counters["consumed"] += got
        if not got:
            return SampleBatch(
                x=np.empty((0, *self.shape), np.float32),
                y=np.empty(0, np.int64),
                ts=np.empty(0, np.float64),
            )
        return SampleBatch(x=np.concatenate(xs), y=np.concatenate(ys), ts=np.concatenate(tss))

    def stats(self) -> dict[str, Any]:
        """The counters a :class:`~edge_client.runtime.buffer.BufferStore` reports (its
        ``stats()`` keys a device's reply and status read)."""
        out: dict[str, Any] = {name: int(self.counters.get(name, 0)) for name in COUNTERS}
        fill = self._held()
        out.update(
            {
                "fill": fill,
                "rejected-by-reason": {},
                "rate": float(self.rate),
                "rate-age-s": round(time.time() - self.rate_updated, 3)
                if self.rate_updated
                else None,
                "capacity": self.capacity,
                "fill-fraction": fill / self.capacity,
                "fill-bytes": fill * sample_bytes(self.shape),
                "policy": self.policy,
            }
        )
        return out

    def to_state(self) -> dict[str, Any]:
        """What to keep between rounds (JSON-ready; the samples' parameters are not in it)."""
        return {
            "rate": self.rate,
            "capacity": self.capacity,
            "policy": self.policy,
            "initial": self.initial,
            "start": self.start,
            "delivered": self.delivered,
            "held": self.held,
            "counters": self.counters,
            "rate-updated": self.rate_updated,
        }

    @classmethod
    def from_state(
        cls,
        samples: Samples,
        state: Mapping[str, Any],
        clock: Callable[[], float] | None = None,
    ) -> LazyBuffer:
        """The buffer :meth:`to_state` described, over ``samples`` (with ``clock``)."""
        return cls(
            samples,
            rate=float(state["rate"]),
            capacity=int(state["capacity"]),
            policy=str(state["policy"]),
            initial=int(state["initial"]),
            start=None if state["start"] is None else float(state["start"]),
            delivered=int(state["delivered"]),
            held=[list(r) for r in state["held"]],
            counters={k: int(v) for k, v in state["counters"].items()},
            rate_updated=float(state["rate-updated"]),
            clock=clock,
        )
