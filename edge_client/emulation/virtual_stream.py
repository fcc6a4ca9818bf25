"""A device's stream on the in-process runner's virtual clock.

Samples are pushed into the device's buffer store as virtual time passes: what streamed in
during the last round before the next one starts, and what a device waits for within a
round (charged on the clock, never slept). Fractions of a sample carry over.

This is the virtual stream as the benchmarks have used it so far; the issue on honest
seed reproductions rebuilds it as a function of the stream's rate and the device's clock.
"""

from __future__ import annotations

import math

import numpy as np

from edge_client.emulation.sources import SampleSource
from edge_client.runtime.buffer import BufferStore
from edge_client.wire.frames import SampleBatch
from edge_client.wire.records import RoundPlan

__all__ = ["VirtualStream"]


class VirtualStream:
    """Feeds ``store`` from ``source`` at ``rate`` samples per virtual second.

    Parameters
    ----------
    store : BufferStore
        The device's buffer.
    source : SampleSource
        Where the samples come from.
    rate : float
        Samples per virtual second; ``math.inf``: a stream always ahead of training (each
        round finds exactly what it takes, without waiting).
    """

    def __init__(self, store: BufferStore, source: SampleSource, rate: float) -> None:
        self.store = store
        self.source = source
        self.rate = rate
        self._owed = 0.0

    def feed(self, amount: float, clock: float) -> None:
        """Append ``amount`` samples (fractions carried over), stamped ``clock``."""
        owed = self._owed + amount
        n = int(owed)
        self._owed = owed - n
        if n > 0:
            x, y = self.source.next(n)
            batch = SampleBatch(x=x, y=y, ts=np.full(n, clock, dtype=np.float64))
            self.store.append([batch], rate=self.rate if math.isfinite(self.rate) else None)

    def wait_for(self, plan: RoundPlan, clock: float) -> float:
        """Stream in what the device waits for under ``plan``; the virtual seconds waited."""
        if math.isinf(self.rate):  # a stream always ahead: exactly what the round takes
            self.feed(plan.batch_size * plan.local_steps - self.store.fill, clock)
            return 0.0
        deficit = plan.samples_to_wait_for() - self.store.fill
        if deficit <= 0 or self.rate <= 0:
            return 0.0
        wait = min(deficit / self.rate, plan.deadline_s)
        self.feed(self.rate * wait, clock)
        return wait
