"""A device's stream on a virtual clock: what has arrived is a function of time, not a push.

A stream at ``rate`` samples/s that had ``initial`` samples waiting when it started has
delivered ``initial + floor(rate * elapsed)`` samples after ``elapsed`` seconds
(:func:`arrived`); a rate change starts a new segment without losing the fraction of a sample
in flight. :class:`VirtualStream` keeps that count against the device's own clock and
materialises, when the clock is advanced, only what a real buffer would hold: arrivals that
its policy would discard anyway (beyond ``capacity``) are counted as received and dropped,
never generated. Advancing to the same time twice adds nothing, so a round's wait and the
time between rounds cannot be counted twice.

It serves the in-process runner (:mod:`deploy.inprocess`) and, through :func:`arrived`, the
simulation engine's replay (:mod:`edge_client.emulation.replay`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from edge_client.emulation.sources import SampleSource
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import POLICY_PERSISTENCE
from edge_client.wire.frames import SampleBatch
from edge_client.wire.records import RoundPlan

__all__ = ["ALWAYS_AHEAD_RATE", "VirtualStream", "arrived", "store_arrivals"]

#: The rate an infinite-rate stream publishes in its buffer: far above anything a plan takes,
#: so that the availability cap never binds it (a buffer with no rate reads as 0: starved).
ALWAYS_AHEAD_RATE = 1e9

# Rates and times are floats: rate * elapsed may land a hair under a whole sample it should
# reach (10 * 0.3 = 2.9999999999999996). Far below a sample at any rate and duration used here.
_EPS = 1e-9


def arrived(rate: float, elapsed: float, initial: int = 0) -> int:
    """Samples a stream has delivered ``elapsed`` seconds after it started.

    Parameters
    ----------
    rate : float
        Samples per second (finite, >= 0).
    elapsed : float
        Seconds since the stream started (negative counts as 0).
    initial : int
        Samples already there when it started.

    Returns
    -------
    int
        ``initial + floor(rate * elapsed)``.
    """
    return initial + math.floor(rate * max(0.0, elapsed) + _EPS)


def store_arrivals(
    store: BufferStore,
    n: int,
    at: float,
    rate: float,
    draw: Callable[[int], tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]],
) -> int:
    """Put ``n`` samples that arrived at time ``at`` into ``store`` as its policy would,
    drawing (``draw(k)``: ``k`` samples) only those it keeps: what a full buffer would drop
    is counted as received and dropped, never generated. Return how many were stored.

    ``truncation`` keeps the newest ``capacity`` (the older would be evicted by them);
    ``persistence`` takes what fits and refuses the newest.
    """
    if n <= 0:
        return 0
    if store.policy == POLICY_PERSISTENCE:
        kept = max(0, min(n, store.capacity - store.fill))
    else:
        kept = min(n, store.capacity)
    if kept < n:
        store.count_discarded(n - kept)
    if kept > 0:
        x, y = draw(kept)
        batch = SampleBatch(x=x, y=y, ts=np.full(kept, at, dtype=np.float64))
        store.append([batch], rate=rate)
    return kept


class VirtualStream:
    """Feeds ``store`` from ``source`` as the virtual clock advances.

    Parameters
    ----------
    store : BufferStore
        The device's buffer.
    source : SampleSource
        Where the samples come from.
    rate : float
        Samples per virtual second; ``math.inf``: a stream always ahead of training (each
        round finds exactly what it takes, without waiting).
    initial : int
        Samples in the buffer when the stream starts (at ``start``).
    start : float
        The virtual time the stream starts.

    Attributes
    ----------
    arrived : int
        Samples the stream has delivered so far (stored or dropped by the policy).
    """

    def __init__(
        self,
        store: BufferStore,
        source: SampleSource,
        rate: float,
        initial: int = 0,
        start: float = 0.0,
    ) -> None:
        self.store = store
        self.source = source
        self.arrived = 0
        self._rate = rate
        self._since = start  # the current rate's segment starts here...
        self._before = float(initial)  # ...with this many (fractional) samples delivered
        self._clock = start
        self.advance_to(start)

    @property
    def rate(self) -> float:
        """Samples per virtual second."""
        return self._rate

    @property
    def clock(self) -> float:
        """The virtual time the stream has been advanced to."""
        return self._clock

    def set_rate(self, rate: float, at: float) -> None:
        """Change the rate from virtual time ``at`` on (arrivals up to ``at`` are kept)."""
        if rate == self._rate:
            return
        self.advance_to(at)
        if math.isfinite(self._rate):
            self._before += self._rate * (at - self._since)
        else:  # what an always-ahead stream delivered is what it was asked for
            self._before = float(self.arrived)
        self._rate, self._since = rate, at

    def due(self, at: float) -> int:
        """Samples delivered by virtual time ``at`` (a finite rate only)."""
        return math.floor(self._before + self._rate * max(0.0, at - self._since) + _EPS)

    def advance_to(self, at: float) -> int:
        """Deliver what arrived up to virtual time ``at``; return how many samples.

        Times before the stream's clock deliver nothing. An infinite-rate stream delivers
        only its initial samples here (see :meth:`wait_for`).
        """
        at = max(at, self._clock)
        self._clock = at
        if math.isinf(self._rate):
            n = max(0, int(self._before) - self.arrived)
        else:
            n = self.due(at) - self.arrived
        self._deliver(n, at)
        return n

    def _deliver(self, n: int, at: float) -> None:
        """Store what the policy keeps of ``n`` arrivals; count the rest as dropped."""
        if n > 0:
            self.arrived += n
            store_arrivals(self.store, n, at, min(self._rate, ALWAYS_AHEAD_RATE), self.source.next)

    def wait_for(self, plan: RoundPlan, at: float) -> float:
        """Advance through the wait ``plan`` asks for from virtual time ``at``.

        Returns
        -------
        float
            The virtual seconds waited: until the buffer holds what the plan's wait rule
            needs, or the plan's deadline, or 0 when it already does.
        """
        self.advance_to(at)
        need = plan.samples_to_wait_for()
        if math.isinf(self._rate):  # a stream always ahead: exactly what the round takes
            n = plan.batch_size * plan.local_steps - self.store.fill
            self._deliver(n, at)
            return 0.0
        deficit = need - self.store.fill
        if deficit <= 0:
            return 0.0
        if self._rate <= 0 or need > self.store.capacity:  # it never comes: the deadline
            self.advance_to(at + plan.deadline_s)
            return plan.deadline_s
        # The first time at which the count reaches what is there plus the deficit.
        target = self.arrived + deficit
        wait = (target - self._before) / self._rate + self._since - at
        wait = min(max(0.0, wait), plan.deadline_s)
        self.advance_to(at + wait)
        return wait
