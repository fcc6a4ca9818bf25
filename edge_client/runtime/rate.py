"""Stream-rate estimation: an exponentially weighted moving average of arrivals per second."""

from __future__ import annotations

import math

from edge_client.runtime.constants import RATE_MIN_TICK_S, RATE_TAU_S

__all__ = ["RateEstimator"]


class RateEstimator:
    """EWMA of arrivals per second, updated over windows of at least ``min_tick`` seconds.

    Each closed window contributes its mean rate with weight ``1 - exp(-dt / tau)``, so the
    estimate forgets the past on a time constant of ``tau`` seconds whatever the tick length.
    The first window starts at the first arrival and initialises the estimate, so an idle
    period before the stream starts does not bias it towards zero.

    Parameters
    ----------
    now : float
        Start of the first window (seconds, any monotonic clock).
    tau : float
        Time constant of the average, seconds.
    min_tick : float
        Shortest window that updates the average.
    """

    def __init__(self, now: float, tau: float = RATE_TAU_S, min_tick: float = RATE_MIN_TICK_S):
        if tau <= 0 or min_tick <= 0:
            raise ValueError("tau and min_tick must be positive")
        self.tau = tau
        self.min_tick = min_tick
        self._window_start = now
        self._count = 0
        self._started = False
        self._rate: float | None = None

    def add(self, n: int, now: float) -> None:
        """Record ``n`` arrivals at time ``now`` in the current window."""
        if self._rate is None and not self._started:
            # The first arrival marks time zero: its samples came in no measurable time.
            self._started = n > 0
            self._window_start = now
            return
        self._count += n

    def update(self, now: float) -> float:
        """Close the current window if it is long enough, and return the estimate."""
        dt = now - self._window_start
        if not self._started:
            return 0.0  # nothing has arrived yet
        if dt >= self.min_tick and self._rate is None and self._count == 0:
            # Arrivals recorded in batches (one per ingest commit, after this update) leave
            # the first window empty: time zero moves here rather than reading a rate of 0.
            self._window_start = now
            return 0.0
        if dt >= self.min_tick:
            inst = self._count / dt
            if self._rate is None:
                self._rate = inst
            else:
                self._rate += (1.0 - math.exp(-dt / self.tau)) * (inst - self._rate)
            self._window_start = now
            self._count = 0
        return self.rate

    @property
    def rate(self) -> float:
        """Current estimate in arrivals per second (0 before the first window closes)."""
        return 0.0 if self._rate is None else self._rate
