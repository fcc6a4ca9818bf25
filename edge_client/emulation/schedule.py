"""When a publisher sends: stream rates (incl. the ScaDLES rate sets) and arrival processes."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from edge_client.emulation.constants import BURST_FACTOR, DISTRIBUTIONS, MIN_STREAM_RATE
from edge_client.wire.constants import RATE_SETS

__all__ = ["arrival_offsets", "draw_rate"]

BURST_PERIOD_S = 2.0


def draw_rate(rate_set: str, rng: np.random.Generator) -> float:
    """Draw one device's stream rate (samples/s) from a ScaDLES rate set.

    ``S1``/``S2`` are uniform and ``S1p``/``S2p`` normal, with the means and standard
    deviations of :data:`~edge_client.wire.constants.RATE_SETS`; results are floored at 1/s.
    """
    try:
        kind, mean, sd = RATE_SETS[rate_set]
    except KeyError:
        raise ValueError(f"rate set must be one of {sorted(RATE_SETS)}, got {rate_set!r}") from None
    if kind == "uniform":  # a uniform law with this mean and sd spans mean +- sd*sqrt(3)
        half = sd * math.sqrt(3.0)
        rate = rng.uniform(mean - half, mean + half)
    else:
        rate = rng.normal(mean, sd)
    return float(max(MIN_STREAM_RATE, rate))


def arrival_offsets(rate: float, distribution: str, rng: np.random.Generator) -> Iterator[float]:
    """Yield send times (seconds from the start) of messages at a mean ``rate`` per second.

    Parameters
    ----------
    rate : float
        Mean messages per second.
    distribution : {"constant", "poisson", "bursty"}
        ``constant`` evenly spaced; ``poisson`` exponential gaps; ``bursty`` on/off: during a
        quarter of every 2 s period it sends at 4x the rate, then is silent.
    rng : numpy.random.Generator
        Randomness for ``poisson``.
    """
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be positive, got {rate}")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    k = 0
    t = 0.0
    on = BURST_PERIOD_S / BURST_FACTOR
    while True:
        if distribution == "constant":
            yield k / rate
        elif distribution == "poisson":
            yield t
            t += float(rng.exponential(1.0 / rate))
        else:
            busy = k / (rate * BURST_FACTOR)  # time spent in on-phases so far
            cycle = math.floor(busy / on)
            yield cycle * BURST_PERIOD_S + (busy - cycle * on)
        k += 1
