"""ScaDLES data injection, aggregator side, in one place: which devices share samples this
round (the pick) and what each device's plan says of injection (the share of the byte
budget, the fraction of a batch drawn from the pool). The device side (sharing, the pool,
mixing into a batch) is the device runtime's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from edge_client.wire.settings_groups import InjectionSettings

__all__ = ["DeviceInjection", "InjectionPlanner", "pick_injectors"]

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


@dataclass(frozen=True)
class DeviceInjection:
    """What one device's round plan says of injection (the plan's ``inject-*`` keys)."""

    mix: float  # fraction of each batch drawn from its pool (0: injection is off)
    publish: bool  # whether it shares samples this round
    beta: float  # the fraction of its fresh samples it shares
    budget: int  # the bytes it may queue: its share of the round's budget


@dataclass(frozen=True)
class InjectionPlanner:
    """The run's data injection (``inject-*`` keys), round by round.

    Parameters
    ----------
    settings : InjectionSettings
        ``inject-alpha``, ``inject-beta``, ``inject-budget``, ``inject-mix``.
    seed : int
        The run's seed: the pick is reproducible from it and the round.
    """

    settings: InjectionSettings
    seed: int

    def pick(self, opted_in: Iterable[str], server_round: int) -> list[str]:
        """The devices that share samples in ``server_round`` (see :func:`pick_injectors`)."""
        return pick_injectors(list(opted_in), self.settings.inject_alpha, self.seed, server_round)

    def for_device(self, device: str, injectors: Sequence[str]) -> DeviceInjection:
        """``device``'s part of the round in which ``injectors`` share: they split the
        round's byte budget equally, and every device mixes pool samples into its batches
        while injection is on."""
        s = self.settings
        return DeviceInjection(
            mix=s.inject_mix if s.inject_alpha > 0 else 0.0,
            publish=device in injectors,
            beta=s.inject_beta,
            budget=s.inject_budget // max(1, len(injectors)),
        )
