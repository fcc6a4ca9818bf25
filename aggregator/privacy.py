"""Differential privacy at the level of a device, aggregator side: the round's clip, the
noise on the sum, adaptive clipping and the accountant, in one place.

``dp = "central"`` is DP-FedAvg (McMahan et al. 2018) with Poisson sampling of devices
(``fraction-train`` q): each device clips the update it sends (after error feedback, its
frame decoding within the clip: :func:`edge_client.wire.codec.compress`); the aggregator
clips each decoded update again (so the bound holds whatever a device sent), sums them, adds
Gaussian noise of standard deviation ``dp-noise x clip`` to every coordinate of the sum and
divides by the *expected* number of devices, q x the live fleet (a fixed denominator: who
took part changes the sum by at most one clip). Each round is one
``PoissonSampledDpEvent(q, GaussianDpEvent(dp-noise))`` for Google's RDP accountant
(``dp_accounting``); the epsilon spent at ``dp-delta`` is in every round's record.

With ``dp-clip-quantile`` the clip adapts (Andrew et al. 2021): each device reports whether
its update was within the clip, the aggregator counts them with Gaussian noise of
``dp-count-noise``, and moves the clip geometrically towards that quantile; the update's
noise multiplier becomes ``(z^-2 - (2 sigma_b)^-2)^-1/2`` so that the two releases together
are a Gaussian mechanism of multiplier ``z``, which is what is accounted.

``dp = "local"``: each device adds the noise itself before sending (an aggregator it does
not trust sees only noised updates). A device's release is a Gaussian of multiplier
``dp-noise / 2`` (two devices' clipped updates differ by up to twice the clip), composed
over every round (an upper bound: the aggregator sees who took part, so there is no
amplification by sampling).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggregator.aggregation import PrivateMean
from edge_client.wire.settings_groups import PrivacySettings

__all__ = ["Event", "Privacy", "PrivacyBudgetError", "epsilon_of", "epsilon_spent"]

log = logging.getLogger(__name__)

#: Andrew et al.'s default count noise: the expected devices of a round over this.
COUNT_NOISE_DIVISOR = 20.0


class PrivacyBudgetError(ValueError):
    """The run's privacy budget cannot pay for its next round."""


#: One accounted round: the DP mode, the sampling rate and the noise multiplier it ran with.
Event = tuple[str, float, float]


def epsilon_spent(settings: PrivacySettings, fraction: float, rounds: int) -> float:
    """The epsilon spent at ``dp-delta`` after ``rounds`` rounds all run with ``settings``
    and ``fraction`` (:func:`epsilon_of` their events)."""
    event: Event = (settings.dp, settings.accounted_fraction(fraction), settings.dp_noise)
    return epsilon_of([event] * max(0, rounds), settings.dp_delta)


def epsilon_of(events: Sequence[Event], delta: float) -> float:
    """The epsilon spent at ``delta`` by these rounds, each as it ran, by Google's RDP
    accountant (``dp_accounting.rdp.RdpAccountant``): a round is a
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (central) or a ``GaussianDpEvent(z /
    2)`` (local).

    Raises
    ------
    ImportError
        If ``dp-accounting`` is not installed (``pip install 'fedstream[privacy]'``).
    """
    if not events:
        return 0.0
    try:
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError as err:  # pragma: no cover - the extra is in every install we test
        raise ImportError(
            "dp needs Google's dp-accounting on the aggregator: pip install 'fedstream[privacy]'"
        ) from err

    def dp_event_of(mode: str, q: float, z: float) -> Any:
        if mode == "local":
            return dp_event.GaussianDpEvent(z / 2)
        return dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))

    absl = logging.getLogger("absl")  # it warns of the low orders it leaves out, every call
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant = rdp_privacy_accountant.RdpAccountant()
        for (mode, q, z), count in Counter(events).items():  # equal rounds in one go
            accountant.compose(dp_event_of(mode, q, z), count)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


@dataclass
class Privacy:
    """The run's differential privacy, round by round: the clip to plan, the accumulator,
    adaptive clipping and the accountant's count of rounds.

    Parameters
    ----------
    settings : PrivacySettings
        The ``dp-*`` keys.
    fraction : float
        ``fraction-train``, the sampling rate the accountant amplifies by.
    clip : float
        The clip of the next round (adaptive clipping moves it).
    rounds : int
        Rounds already composed (restored from a checkpoint).
    history : list of Event
        Each composed round's event as it ran (a resume with other ``dp-*`` keys or another
        ``fraction-train`` composes its own from then on).
    """

    settings: PrivacySettings
    fraction: float
    clip: float = 0.0
    rounds: int = 0
    history: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.clip <= 0:
            self.clip = self.settings.dp_clip
        self._rng = np.random.default_rng()  # the operating system's entropy, never a seed
        self._spent: dict[int, float] = {}  # rounds -> epsilon (the accountant takes ~50 ms)
        if len(self.history) < self.rounds:  # a checkpoint from before rounds were kept
            self.history += [self._event()] * (self.rounds - len(self.history))

    @property
    def on(self) -> bool:
        """Whether the run is differentially private."""
        return self.settings.on

    def plan(self) -> tuple[float, float]:
        """(dp-clip, dp-noise) of a device's round plan: the clip, and the noise the device
        adds itself (local DP only)."""
        if not self.on:
            return 0.0, 0.0
        return self.clip, self.settings.dp_noise if self.settings.dp == "local" else 0.0

    def accumulator(self, shapes: Mapping[str, tuple[int, ...]], live: int) -> PrivateMean | None:
        """Central DP's accumulator for a round with ``live`` devices before sampling;
        None otherwise (local DP's updates are noised already: the run's rule averages)."""
        if self.settings.dp != "central":
            return None
        expected = self.fraction * live
        return PrivateMean(shapes, self.clip, self._update_noise(expected), expected, self._rng)

    def _count_noise(self, expected: float) -> float:
        return self.settings.dp_count_noise or expected / COUNT_NOISE_DIVISOR

    def _update_noise(self, expected: float) -> float:
        """The update's noise multiplier: ``dp-noise``, less what the count's noise already
        spends under adaptive clipping (Andrew et al., Theorem 1)."""
        z = self.settings.dp_noise
        if self.settings.dp_clip_quantile <= 0:
            return z
        rest = z**-2 - (2 * self._count_noise(expected)) ** -2
        if rest <= 0:
            raise ValueError(
                f"dp-count-noise {self._count_noise(expected):g} is too small for dp-noise "
                f"{z:g}: adaptive clipping needs dp-count-noise > 1 / (2 x dp-noise)"
            )
        return float(rest**-0.5)

    def after_round(self, accumulator: PrivateMean | None) -> None:
        """Count the round for the accountant; under adaptive clipping move the clip towards
        the quantile from the noised count of updates within it."""
        self.rounds += 1
        self.history.append(self._event())
        self._spent.clear()
        q = self.settings.dp_clip_quantile
        if accumulator is None or q <= 0:
            return
        expected = accumulator.expected
        # The centred count (sensitivity 1/2) is what the noise split of _update_noise
        # assumes; the fraction within the clip is read back from it around 1/2.
        noised = accumulator.centred_count() + self._rng.normal(0.0, self._count_noise(expected))
        within = noised / expected + 0.5
        self.clip *= math.exp(-self.settings.dp_clip_lr * (within - q))

    def spent(self, rounds: int | None = None) -> float:
        """The epsilon spent after ``rounds`` rounds (the rounds composed so far by default),
        each composed round as it ran, any beyond them with this run's settings."""
        rounds = self.rounds if rounds is None else rounds
        if rounds not in self._spent:
            events = self.history[:rounds]
            events += [self._event()] * (rounds - len(events))
            self._spent[rounds] = epsilon_of(events, self.settings.dp_delta)
        return self._spent[rounds]

    def _event(self) -> Event:
        """This run's round, as the accountant composes it."""
        settings = self.settings
        return (settings.dp, settings.accounted_fraction(self.fraction), settings.dp_noise)

    def affordable(self) -> bool:
        """Whether the budget (``dp-epsilon``; none when 0) pays for one more round."""
        budget = self.settings.dp_epsilon
        return not self.on or budget <= 0 or self.spent(self.rounds + 1) <= budget

    def check_budget(self) -> None:
        """Refuse to start a run (or resume one) whose budget cannot pay for a round.

        Raises
        ------
        PrivacyBudgetError
            With what one more round would spend and the budget.
        """
        if not self.affordable():
            raise PrivacyBudgetError(
                f"dp-epsilon {self.settings.dp_epsilon:g} is spent: round {self.rounds + 1} "
                f"would make it {self.spent(self.rounds + 1):.3g} (delta "
                f"{self.settings.dp_delta:g}, {self.rounds} rounds done)"
            )

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the rounds composed, each as it ran, the clip and the mode."""
        return {
            "rounds": self.rounds,
            "clip": self.clip,
            "history": [list(event) for event in self.history],
            "dp": self.settings.dp,
        }

    @classmethod
    def from_state(
        cls,
        settings: PrivacySettings,
        fraction: float,
        state: Mapping[str, Any],
        done_rounds: int = 0,
    ) -> Privacy:
        """The privacy of a resumed run, from :meth:`state_dict`'s (empty: a fresh one) and
        the rounds its checkpoint holds; a checkpoint from before each round's event was
        kept counts its rounds as this run's.

        Raises
        ------
        PrivacyBudgetError
            If the run resumes under DP from rounds that ran without it: no epsilon holds
            for the models those released.
        """
        before = state.get("dp")
        if before is None:  # a checkpoint from before the mode was kept
            before = settings.dp if int(state.get("rounds", 0)) else "off"
        if settings.on and before == "off" and done_rounds > 0:
            raise PrivacyBudgetError(
                "dp is on but the checkpoint's rounds ran without it: the models they "
                "released are covered by no epsilon; start a fresh run (another "
                "checkpoint-dir) for a private one"
            )
        history = [(str(m), float(q), float(z)) for m, q, z in state.get("history", [])]
        return cls(
            settings,
            fraction,
            float(state.get("clip", 0.0)),
            int(state.get("rounds", 0)),
            history,
        )
