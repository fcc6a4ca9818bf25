"""Replayed streams: virtual devices (Flower simulation) fed into the same buffer store.

In Flower's simulation engine there is no MQTT: each virtual device's ClientApp tops its
buffer up, before training, with what its stream has delivered since it started at its
configured rate (wall clock, :func:`~edge_client.emulation.virtual_stream.arrived`) less
what earlier top-ups stored, from the same synthetic task the publisher uses, sample ``i``
of a stream being :class:`~edge_client.emulation.lazy_buffer.StreamSamples`'s ``i``-th
(what :class:`~edge_client.emulation.lazy_buffer.LazyBuffer` holds as counts instead). The
ClientApp then trains exactly as on a real device.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_client.emulation.lazy_buffer import Samples
from edge_client.emulation.virtual_stream import arrived, store_arrivals
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import POLICY_PERSISTENCE

__all__ = ["replay_into"]

_START = "replay-start"  # wall time of the first top-up: the stream's start
_DELIVERED = "replay-delivered"  # samples delivered so far (stored or dropped)


def replay_into(
    path: str | Path,
    samples: Samples,
    rate: float,
    *,
    initial: int,
    capacity: int,
    now: float | None = None,
    policy: str | None = None,
) -> int:
    """Append what a device's stream delivered since the last call; return how many arrived
    (some may have been dropped by the capacity).

    Parameters
    ----------
    path : str or Path
        The device's buffer file (created on the first call).
    samples : Samples
        The device's stream: the synthetic task's (its id, the run's seed, the task's shape
        and classes, the skew) or a part of a recording.
    rate : float
        Samples per second.
    initial : int
        Samples present at the first call (the stream ran before training started).
    capacity : int
        Buffer capacity.
    now : float, optional
        Current time (defaults to the wall clock).
    policy : str, optional
        The buffer's policy when the call creates it (default: truncation).
    """
    now = time.time() if now is None else now
    shape = samples.shape
    with BufferStore(path, shape=shape, capacity=capacity, policy=policy) as store:
        start = float(store.get_meta(_START) or now)
        delivered = int(store.get_meta(_DELIVERED) or 0)
        due = arrived(rate, now - start, initial) - delivered

        def draw(k: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
            # the k the policy keeps: the newest (truncation) or the first (persistence)
            first = delivered if store.policy == POLICY_PERSISTENCE else delivered + due - k
            return samples.range(first, first + k)

        store_arrivals(store, due, now, rate, draw)
        store.set_meta(_START, repr(start))
        store.set_meta(_DELIVERED, str(delivered + max(0, due)))
    return due
