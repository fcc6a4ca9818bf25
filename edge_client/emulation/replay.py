"""Replayed streams: virtual devices (Flower simulation) fed into the same buffer store.

In Flower's simulation engine there is no MQTT: each virtual device's ClientApp tops its
buffer up, before training, with what its stream has delivered since it started at its
configured rate (wall clock, :func:`~edge_client.emulation.virtual_stream.arrived`) less
what earlier top-ups stored, from the same synthetic task the publisher uses. The ClientApp
then trains exactly as on a real device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_client.emulation.sources import SyntheticSource, label_distribution
from edge_client.emulation.virtual_stream import arrived, store_arrivals
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.seeding import device_rng
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.synthetic import SensorTask

__all__ = ["replay_into"]

_START = "replay-start"  # wall time of the first top-up: the stream's start
_DELIVERED = "replay-delivered"  # samples delivered so far (stored or dropped)
_COUNT = "replay-count"  # top-ups so far: seeds each top-up's samples
_SKEW_STREAM = 1_000_003  # seed stream of a device's label mix and feature shift


def replay_into(
    path: str | Path,
    device_id: str,
    rate: float,
    *,
    initial: int,
    capacity: int,
    seed: int = 0,
    now: float | None = None,
    labels: Sequence[int] | None = None,
    dirichlet: float | None = None,
    feature_shift: float = 0.0,
    shape: tuple[int, ...] = DEFAULT_SHAPE,
    num_classes: int = DEFAULT_NUM_CLASSES,
) -> int:
    """Append what ``device_id``'s stream delivered since the last call; return how many
    arrived (some may have been dropped by the capacity).

    Parameters
    ----------
    path : str or Path
        The device's buffer file (created on the first call, truncation policy).
    device_id : str
        Seeds the device's stream.
    rate : float
        Samples per second.
    initial : int
        Samples present at the first call (the stream ran before training started).
    capacity : int
        Buffer capacity (truncation).
    seed : int
        Run seed.
    now : float, optional
        Current time (defaults to the wall clock).
    labels, dirichlet, feature_shift
        Skew of this device's stream, as the publisher's ``--classes``, ``--dirichlet`` and
        ``--feature-shift`` (fixed per device and seed across calls).
    shape, num_classes
        The synthetic task's sample shape and classes (the run's ``sample-shape`` and
        ``num-classes``).
    """
    now = time.time() if now is None else now
    with BufferStore(path, shape=shape, capacity=capacity) as store:
        start = float(store.get_meta(_START) or now)
        delivered = int(store.get_meta(_DELIVERED) or 0)
        count = int(store.get_meta(_COUNT) or 0)
        due = arrived(rate, now - start, initial) - delivered

        def draw(k: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
            task = SensorTask(shape, num_classes)
            probs = label_distribution(
                task.num_classes, device_rng(seed, device_id, _SKEW_STREAM), labels, dirichlet
            )
            source = SyntheticSource(task, device_rng(seed, device_id, count), probs)
            if feature_shift:
                shift_rng = device_rng(seed, device_id, _SKEW_STREAM + 1)
                source.shift = task.device_shift(shift_rng, feature_shift)
            return source.next(k)

        store_arrivals(store, due, now, rate, draw)
        store.set_meta(_START, repr(start))
        store.set_meta(_DELIVERED, str(delivered + max(0, due)))
        store.set_meta(_COUNT, str(count + 1))
    return due
