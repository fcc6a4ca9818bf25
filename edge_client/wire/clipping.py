"""The L2 norm of an update and clipping to it: what differential privacy bounds.

One home for both sides: a device clips the update it sends (:func:`edge_client.wire.codec.
compress` with a clip), and the aggregator clips what it decoded again before it sums
(:mod:`aggregator.privacy`), so that the sum's sensitivity holds whatever a device sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["clip_to", "l2_norm"]


def l2_norm(tensors: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of all the tensors' values together (float64)."""
    return math.sqrt(sum(float(np.square(t, dtype=np.float64).sum()) for t in tensors.values()))


def clip_to(tensors: Mapping[str, np.ndarray], bound: float) -> tuple[dict[str, np.ndarray], bool]:
    """Scale the tensors down, together, so that their L2 norm is at most ``bound``.

    Returns
    -------
    tuple
        The (possibly scaled) float32 tensors, and whether they were within ``bound``
        already (nothing was cut).
    """
    norm = l2_norm(tensors)
    arrays = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    if norm <= bound:
        return arrays, True
    scale = np.float32(bound / norm)
    return {k: v * scale for k, v in arrays.items()}, False
