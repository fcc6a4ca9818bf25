"""Mixing: each training batch takes its planned share of samples from the injection pool.

With ``inject-mix`` = m and a batch of b, a step trains on ``round(m * b)`` pool samples
(drawn at random, not consumed) next to the rest from the device's own buffer, at least one
own sample per step. Pool samples are never scored by the prequential evaluation: only
the own samples are (:func:`~edge_client.runtime.trainer.train_local`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edge_client.runtime.buffer import BufferStore
    from edge_client.task.preprocess import Preprocessor
    from edge_client.wire.frames import SampleBatch

__all__ = ["draw_pooled", "mix_into", "planned_mix"]


def planned_mix(inject_mix: float, batch: int, pool: BufferStore | None) -> int:
    """Pool samples per step in a batch of ``batch``: ``round(inject_mix * batch)`` when the
    pool holds any, leaving at least one own sample per step."""
    mixed = round(inject_mix * batch) if pool is not None and pool.fill > 0 else 0
    return min(mixed, batch - 1)


def draw_pooled(
    pool: BufferStore | None, mixed: int, steps: int, rng: np.random.Generator | None
) -> SampleBatch | None:
    """``mixed`` pool samples for each of ``steps`` steps (None without a pool)."""
    return pool.sample(mixed * steps, rng or np.random.default_rng()) if pool else None


def mix_into(
    x: np.ndarray,
    y: np.ndarray,
    pooled: SampleBatch | None,
    mixed: int,
    preprocessor: Preprocessor | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step batches ``x`` (steps, own, *shape) and ``y`` (steps, own) with each step's
    pool samples appended (preprocessed as the own ones were)."""
    if pooled is None or not mixed:
        return x, y
    steps = x.shape[0]
    features = pooled.x if preprocessor is None else preprocessor(pooled.x)
    x = np.concatenate([x, features.reshape(steps, mixed, *x.shape[2:])], 1)
    y = np.concatenate([y, pooled.y.reshape(steps, mixed)], 1)
    return x, y
