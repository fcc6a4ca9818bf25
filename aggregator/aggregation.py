"""How a round's updates are combined: accumulators fed one decoded update at a time.

Each takes ``update(delta, weight, device)`` as replies arrive and gives ``result()`` at the
end of the round: the combined delta and the devices it was made of (None when no update
had any weight).

- :class:`WeightedMean` (``aggregation = "fedavg"``): the sample-weighted mean, kept as one
  running float64 sum, so the aggregator's memory is O(model) whatever the fleet's size.
- :class:`AdaptiveMean` (``aggregation = "adaptive"``, the default): FedNova's normalised
  averaging with each device weighted ``n / (n + r)`` for ``n`` samples, ``r`` the fleet's
  noise-to-heterogeneity ratio estimated from the updates themselves
  (:mod:`aggregator.heterogeneity`): sample weights where the streams are alike (so that a
  slow device's small batch adds no more than its share of noise), equal weights where they
  are skewed (so that the fast devices' classes do not take over), and no device above the
  weight of one whatever its samples. Streaming, O(model) too.
- :class:`NormalisedMean` (``aggregation = "fednova"``): FedNova's normalised averaging:
  each device's update divided by its local steps, devices weighted equally, scaled back by
  the mean number of steps. With per-device batches (OmniLearn) a sample-weighted mean gives
  a fast device many times a slow one's weight, so under label skew the model leans to the
  fast devices' classes (the objective inconsistency FedNova corrects); here each device's
  objective counts once. Streaming, O(model) too.
- :class:`PrivateMean` (differential privacy, ``dp = "central"``: :mod:`aggregator.privacy`):
  each update clipped, the equal-weight sum noised and divided by the expected count.
- :class:`RobustRule` (``trimmed-mean``, ``median``, ``krum``, ``multi-krum``): keeps every
  update (O(devices x model)) and applies Flower's Byzantine-robust rule at the end
  (:func:`aggregator.robust.robust_aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from aggregator.heterogeneity import Heterogeneity, PairMoments, adaptive_weight
from aggregator.robust import robust_aggregate
from edge_client.wire.clipping import clip_to
from edge_client.wire.settings_groups import AggregationSettings

__all__ = [
    "Accumulator",
    "AdaptiveMean",
    "NormalisedMean",
    "PrivateMean",
    "RobustRule",
    "WeightedMean",
    "make_accumulator",
]

Delta = dict[str, np.ndarray]


class Accumulator(Protocol):
    """What the strategy feeds a round's updates to."""

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add one device's update, trained on ``weight`` samples (> 0) in ``steps`` steps;
        ``boost`` multiplies the weight the rule gives it (a drifting device's,
        :mod:`aggregator.drift_reaction`; the robust rules ignore it: a device's own claim must not
        buy it influence there)."""
        ...

    def result(self) -> tuple[Delta, list[str]] | None:
        """(combined delta, devices it was made of), or None without any update."""
        ...


class _RunningSum:
    """What the streaming rules share: one float64 sum per tensor, the devices added, their
    total weight and steps, and a scale applied at the end (the update itself is not kept:
    memory O(model)). A rule says what one update adds (:meth:`_term`) and weighs
    (:meth:`_weight`), and how the sum becomes the update (:meth:`_finish`).

    Parameters
    ----------
    shapes : mapping of str to shape
        The model's tensors.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._sum = {k: np.zeros(s, np.float64) for k, s in shapes.items()}
        self._devices: list[str] = []
        self._total = 0.0  # the updates' weights, as the rule weighs them
        self._steps = 0  # their local steps

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add one device's update to the running sum (see :class:`Accumulator`)."""
        for k, d in delta.items():
            self._sum[k] += self._term(d.astype(np.float64), weight, steps, boost)
        self._total += self._weight(weight, boost)
        self._steps += max(1, steps)
        self._devices.append(device)

    def _term(self, delta: np.ndarray, weight: int, steps: int, boost: float) -> np.ndarray:
        """What one tensor of an update adds to its sum."""
        raise NotImplementedError

    def _weight(self, weight: int, boost: float) -> float:
        """What an update adds to the total weight."""
        raise NotImplementedError

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """One tensor of the combined update, from its running sum."""
        raise NotImplementedError

    def result(self) -> tuple[Delta, list[str]] | None:
        """The combined update, and the devices it was made of (None when no update had
        any weight)."""
        if not self._devices or self._total == 0:
            return None
        return {k: self._finish(a) for k, a in self._sum.items()}, list(self._devices)


class WeightedMean(_RunningSum):
    """The streaming sample-weighted mean of the updates (FedAvg on deltas)."""

    def _term(self, delta: np.ndarray, weight: int, steps: int, boost: float) -> np.ndarray:
        """``boost * weight * delta``."""
        return (weight * boost) * delta

    def _weight(self, weight: int, boost: float) -> float:
        return weight * boost

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """The sum over the total weight."""
        return total / self._total


class NormalisedMean(_RunningSum):
    """FedNova's normalised average with equal device weights:
    ``mean_i(steps_i) * mean_i(delta_i / steps_i)``.

    With plain local SGD this is FedNova's rule for ``p_i = 1/n``; fedstream's devices use
    momentum, whose exact normaliser FedNova also gives, but every device runs the same ``K``
    steps (a device never trains more steps, only smaller batches), so the normaliser
    cancels and the rule is the equal-weight mean of the updates.
    """

    def _term(self, delta: np.ndarray, weight: int, steps: int, boost: float) -> np.ndarray:
        """``boost * delta / steps`` (the sample count does not weigh; each device weighs
        1, or ``boost``)."""
        return boost * delta / max(1, steps)

    def _weight(self, weight: int, boost: float) -> float:
        return boost

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """The (weighted) mean normalised update times the mean number of steps."""
        n = len(self._devices)
        return total * (self._steps / n / self._total)


class AdaptiveMean(_RunningSum):
    """FedNova's normalised average with random-effects weights:
    ``mean_i(steps_i) * sum_i(w_i * delta_i / steps_i) / sum_i(w_i)``, ``w_i = n_i / (n_i + r)``
    (times a drift boost) for ``n_i`` samples (see :mod:`aggregator.heterogeneity`).

    ``r`` is the estimate made from the earlier rounds, fixed for this one (so the sum is
    streaming); :meth:`result` then adds this round's updates to the estimate.

    Parameters
    ----------
    shapes : mapping of str to shape
        The model's tensors.
    heterogeneity : Heterogeneity
        The run's estimate (kept across rounds, checkpointed by the strategy's owner).
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], heterogeneity: Heterogeneity) -> None:
        super().__init__(shapes)
        self.heterogeneity = heterogeneity
        self.ratio = heterogeneity.ratio()
        self._pairs = PairMoments(shapes)

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add one device's update to the running sums (see :class:`Accumulator`)."""
        self._pairs.add(delta, weight, steps)
        super().update(delta, weight, device, steps, boost)

    def _term(self, delta: np.ndarray, weight: int, steps: int, boost: float) -> np.ndarray:
        """``boost * n / (n + r) * delta / steps``."""
        return self._weight(weight, boost) * (delta / max(1, steps))

    def _weight(self, weight: int, boost: float) -> float:
        return boost * adaptive_weight(weight, self.ratio)

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """The weighted mean per step times the mean number of steps."""
        return total * (self._steps / len(self._devices) / self._total)

    def result(self) -> tuple[Delta, list[str]] | None:
        """The combined update (see :class:`Accumulator`); the round's updates also go into
        the heterogeneity estimate the next rounds weigh by."""
        self.heterogeneity.observe(self._pairs)
        return super().result()


class PrivateMean(_RunningSum):
    """Central differential privacy's rule: each update clipped to ``clip`` (its weight,
    steps and boost do not count: each device weighs the same, which is what the noise
    covers), summed; each tensor of the sum gets Gaussian noise of ``noise x clip`` and is
    divided by ``expected`` devices. Counts the updates their devices reported within the
    clip (adaptive clipping) and those the aggregator had to clip (a device that did not).

    Parameters
    ----------
    shapes : mapping of str to shape
        The shared tensors.
    clip, noise : float
        The round's clip and the update's noise multiplier.
    expected : float
        The denominator: q x the live fleet.
    rng : numpy.random.Generator
        The noise's generator (never a seeded one in a run: whoever knew the seed could
        take the noise off).
    """

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        clip: float,
        noise: float,
        expected: float,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(shapes)
        self.clip, self.noise, self.expected = clip, noise, max(expected, 1e-12)
        self._rng = rng
        self.within = 0  # updates the device reported within the clip
        self.reported = 0  # reports of it (one per update)
        self.clipped_here = 0  # updates over the clip as decoded (the aggregator clipped them)

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add one device's update, clipped over all its tensors together."""
        clipped, fits = clip_to(delta, self.clip * (1 + 1e-6))  # float slack, not a loophole
        self.clipped_here += not fits
        super().update(clipped, weight, device, steps, boost)

    def count_within(self, within: bool) -> None:
        """Count a device's report that its update was within the clip before clipping."""
        self.within += int(within)
        self.reported += 1

    def centred_count(self) -> float:
        """The sum over the reports of (within - 1/2): adding or removing one device moves it
        by 1/2 at most, the sensitivity the adaptive clip's noise is accounted for (Andrew et
        al. 2021; the plain count's is 1)."""
        return self.within - self.reported / 2

    def _term(self, delta: np.ndarray, weight: int, steps: int, boost: float) -> np.ndarray:
        return delta

    def _weight(self, weight: int, boost: float) -> float:
        return 1.0

    def _finish(self, total: np.ndarray) -> np.ndarray:
        return self.release(total)

    def release(self, total: np.ndarray) -> np.ndarray:
        """One tensor of the update from its sum of clipped updates (this round's, or the
        unmasked sum of secure aggregation): noised, over the expected count."""
        return (total + self._rng.normal(0.0, self.noise * self.clip, total.shape)) / self.expected

    def result(self) -> tuple[Delta, list[str]] | None:
        """The noised mean, released every round: with no update in it, the noise alone
        (the accountant counts a Poisson-sampled release each round; whether a round had
        updates must not decide whether one is released)."""
        if not self._devices:
            return {k: self.release(np.zeros_like(a)) for k, a in self._sum.items()}, []
        return super().result()


class RobustRule:
    """A Byzantine-robust rule over every update of the round.

    Parameters
    ----------
    rule : str
        ``trimmed-mean``, ``median``, ``krum`` or ``multi-krum``.
    trim_fraction : float
        ``trimmed-mean``: fraction cut at each end.
    malicious : int
        ``krum`` / ``multi-krum``: updates that may be hostile (``f``).
    """

    def __init__(self, rule: str, trim_fraction: float, malicious: int) -> None:
        self.rule = rule
        self.trim_fraction = trim_fraction
        self.malicious = malicious
        self._kept: list[tuple[Mapping[str, np.ndarray], int, str]] = []

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Keep the update for the end of the round (``boost`` is ignored)."""
        self._kept.append((delta, weight, device))

    def result(self) -> tuple[Delta, list[str]] | None:
        """The rule's combination and the devices it kept."""
        if not self._kept:
            return None
        combined, picked = robust_aggregate(
            self.rule,
            [dict(d) for d, _, _ in self._kept],
            [w for _, w, _ in self._kept],
            self.trim_fraction,
            self.malicious,
        )
        return combined, [self._kept[i][2] for i in picked]


def make_accumulator(
    settings: AggregationSettings,
    shapes: Mapping[str, tuple[int, ...]],
    heterogeneity: Heterogeneity | None = None,
) -> Accumulator:
    """The accumulator of the run's ``aggregation`` rule, for a model of these tensors
    (``adaptive`` weighs by ``heterogeneity``, the run's estimate: a fresh one if None)."""
    if settings.aggregation == "adaptive":
        return AdaptiveMean(shapes, heterogeneity or Heterogeneity())
    if settings.aggregation == "fedavg":
        return WeightedMean(shapes)
    if settings.aggregation == "fednova":
        return NormalisedMean(shapes)
    return RobustRule(settings.aggregation, settings.trim_fraction, settings.krum_malicious)
