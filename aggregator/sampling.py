"""Which live devices take part in a round: Poisson sampling (``fraction-train``).

Each device is drawn independently with probability q, so a round's size varies (it is
Binomial); this is the sampling DP-FedAvg's accountant amplifies by
(:mod:`aggregator.privacy`). Amplification holds only while the draw is secret: under
differential privacy it comes from the operating system's entropy (``seed`` None), never the
run's seed, which whoever reads the run config knows; a private run's draws do not repeat.
Otherwise the draw is seeded by the run's seed and the round, and each device's draw is tied
to its position among the devices sorted by id, so a seeded run repeats.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["SAMPLE_STREAM", "poisson_sample", "secret_rng"]

SAMPLE_STREAM = 91  # seed stream of the per-round device draw


def poisson_sample(
    devices: Mapping[int, str], fraction: float, seed: int | None, server_round: int
) -> list[int]:
    """The nodes of ``devices`` (node -> device id) drawn for ``server_round``, each with
    probability ``fraction`` (all of them at 1), in the order given; ``seed`` None: a secret
    draw, from the operating system's entropy (under differential privacy)."""
    if fraction >= 1.0:
        return list(devices)
    rng = (
        secret_rng() if seed is None else np.random.default_rng([seed, server_round, SAMPLE_STREAM])
    )
    by_id = sorted(devices, key=lambda n: devices[n])
    drawn = {n for n, u in zip(by_id, rng.random(len(by_id)), strict=True) if u < fraction}
    return [n for n in devices if n in drawn]


def secret_rng() -> np.random.Generator:
    """A generator seeded from the operating system's entropy: a secret draw's (tests that
    need a repeatable private run put a seeded one in its place)."""
    return np.random.default_rng()
