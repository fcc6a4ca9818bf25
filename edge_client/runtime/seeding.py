"""Reproducible randomness per device: the same seed and device id, the same draws."""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["device_rng"]


def device_rng(seed: int, device_id: str, stream: int = 0) -> np.random.Generator:
    """A generator seeded by ``(seed, device_id, stream)``: reproducible, different per device.

    ``stream`` separates independent draws of one device (its rate, its samples, ...).
    """
    return np.random.default_rng([seed, zlib.crc32(device_id.encode()), stream])
