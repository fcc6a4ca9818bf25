"""Replayed streams: virtual devices (Flower simulation) fed into the same buffer store.

In Flower's simulation engine there is no MQTT: each virtual device's ClientApp tops its
buffer up, before training, with what its stream would have delivered since the last
top-up at its configured rate (wall clock), from the same synthetic task the publisher
uses. The ClientApp then trains exactly as on a real device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edge_client.emulation.sources import SyntheticSource, label_distribution
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.seeding import device_rng
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch

__all__ = ["replay_into"]

_LAST = "replay-at"
_COUNT = "replay-count"
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
) -> int:
    """Append what ``device_id``'s stream delivered since the last call; return how many.

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
    """
    now = time.time() if now is None else now
    with BufferStore(path, shape=DEFAULT_SHAPE, capacity=capacity) as store:
        last = store.get_meta(_LAST)
        count = int(store.get_meta(_COUNT) or 0)
        due = initial if last is None else int(rate * max(0.0, now - float(last)))
        due = min(due, capacity)  # older ones would be truncated anyway
        if due > 0:
            task = SensorTask(DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)
            probs = label_distribution(
                task.num_classes, device_rng(seed, device_id, _SKEW_STREAM), labels, dirichlet
            )
            source = SyntheticSource(task, device_rng(seed, device_id, count), probs)
            if feature_shift:
                shift_rng = device_rng(seed, device_id, _SKEW_STREAM + 1)
                source.shift = task.device_shift(shift_rng, feature_shift)
            x, y = source.next(due)
            store.append([SampleBatch(x=x, y=y, ts=np.full(due, now))], rate=rate)
        store.set_meta(_LAST, repr(now))
        store.set_meta(_COUNT, str(count + 1))
    return due
