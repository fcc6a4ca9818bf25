"""ScaDLES data injection, aggregator side: which devices share samples this round."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pick_injectors"]

INJECT_STREAM = 77  # seed stream of the injector draw


def pick_injectors(
    opted_in: Sequence[str], alpha: float, seed: int, server_round: int
) -> list[str]:
    """ScaDLES: the devices asked to share samples this round.

    Parameters
    ----------
    opted_in : sequence of str
        Devices whose last reply said they take part in data injection.
    alpha : float
        Fraction of them to pick (at least one, when above 0).
    seed, server_round : int
        The draw is reproducible from these.

    Returns
    -------
    list of str
        The picked devices, sorted; none when ``alpha`` is 0 or none opted in.
    """
    opted = sorted(opted_in)
    if alpha <= 0 or not opted:
        return []
    n = max(1, round(alpha * len(opted)))
    rng = np.random.default_rng([seed, server_round, INJECT_STREAM])
    return sorted(str(d) for d in rng.choice(opted, size=n, replace=False))
