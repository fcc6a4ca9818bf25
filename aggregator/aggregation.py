"""How a round's updates are combined: accumulators fed one decoded update at a time.

Each takes ``update(delta, weight, device)`` as replies arrive and gives ``result()`` at the
end of the round: the combined delta and the devices it was made of (None when no update
had any weight).

- :class:`WeightedMean` (``aggregation = "fedavg"``): the sample-weighted mean, kept as one
  running float64 sum, so the aggregator's memory is O(model) whatever the fleet's size.
- :class:`NormalisedMean` (``aggregation = "fednova"``): FedNova's normalised averaging:
  each device's update divided by its local steps, devices weighted equally, scaled back by
  the mean number of steps. With per-device batches (OmniLearn) a sample-weighted mean gives
  a fast device many times a slow one's weight, so under label skew the model leans to the
  fast devices' classes (the objective inconsistency FedNova corrects); here each device's
  objective counts once. Streaming, O(model) too.
- :class:`RobustRule` (``trimmed-mean``, ``median``, ``krum``, ``multi-krum``): keeps every
  update (O(devices x model)) and applies Flower's Byzantine-robust rule at the end
  (:func:`aggregator.robust.robust_aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from aggregator.robust import robust_aggregate
from edge_client.wire.run_config import RunSettings

__all__ = ["Accumulator", "NormalisedMean", "RobustRule", "WeightedMean", "make_accumulator"]

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
    """What the streaming rules share: one float64 sum per tensor, the devices added, and a
    scale applied at the end (the update itself is not kept: memory O(model))."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._sum = {k: np.zeros(s, np.float64) for k, s in shapes.items()}
        self._devices: list[str] = []

    def _empty(self) -> bool:
        """Whether no update had any weight."""
        return not self._devices

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """One tensor of the combined update, from its running sum."""
        raise NotImplementedError

    def result(self) -> tuple[Delta, list[str]] | None:
        """The combined update, and the devices it was made of."""
        if self._empty():
            return None
        return {k: self._finish(a) for k, a in self._sum.items()}, list(self._devices)


class WeightedMean(_RunningSum):
    """The streaming sample-weighted mean of the updates (FedAvg on deltas).

    Parameters
    ----------
    shapes : mapping of str to shape
        The model's tensors.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(shapes)
        self._total = 0.0

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add ``boost * weight * delta`` to the running sum."""
        w = weight * boost
        for k, d in delta.items():
            self._sum[k] += w * d.astype(np.float64)
        self._total += w
        self._devices.append(device)

    def _empty(self) -> bool:
        return self._total == 0

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

    Parameters
    ----------
    shapes : mapping of str to shape
        The model's tensors.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(shapes)
        self._steps = 0
        self._weights = 0.0

    def update(
        self,
        delta: Mapping[str, np.ndarray],
        weight: int,
        device: str,
        steps: int = 1,
        boost: float = 1.0,
    ) -> None:
        """Add ``boost * delta / steps`` to the running sum (the sample count does not
        weigh; each device weighs 1, or ``boost``)."""
        steps = max(1, steps)
        for k, d in delta.items():
            self._sum[k] += boost * d.astype(np.float64) / steps
        self._steps += steps
        self._weights += boost
        self._devices.append(device)

    def _finish(self, total: np.ndarray) -> np.ndarray:
        """The (weighted) mean normalised update times the mean number of steps."""
        n = len(self._devices)
        return total * (self._steps / n / self._weights)


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


def make_accumulator(settings: RunSettings, shapes: Mapping[str, tuple[int, ...]]) -> Accumulator:
    """The accumulator of the run's ``aggregation`` rule, for a model of these tensors."""
    if settings.aggregation == "fedavg":
        return WeightedMean(shapes)
    if settings.aggregation == "fednova":
        return NormalisedMean(shapes)
    return RobustRule(settings.aggregation, settings.trim_fraction, settings.krum_malicious)
