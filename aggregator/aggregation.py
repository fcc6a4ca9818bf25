"""How a round's updates are combined: accumulators fed one decoded update at a time.

Each takes ``update(delta, weight, device)`` as replies arrive and gives ``result()`` at the
end of the round: the combined delta and the devices it was made of (None when no update
had any weight).

- :class:`WeightedMean` (``aggregation = "fedavg"``): the sample-weighted mean, kept as one
  running float64 sum, so the aggregator's memory is O(model) whatever the fleet's size.
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

__all__ = ["Accumulator", "RobustRule", "WeightedMean", "make_accumulator"]

Delta = dict[str, np.ndarray]


class Accumulator(Protocol):
    """What the strategy feeds a round's updates to."""

    def update(self, delta: Mapping[str, np.ndarray], weight: int, device: str) -> None:
        """Add one device's update, trained on ``weight`` samples (> 0)."""
        ...

    def result(self) -> tuple[Delta, list[str]] | None:
        """(combined delta, devices it was made of), or None without any update."""
        ...


class WeightedMean:
    """The streaming sample-weighted mean of the updates (FedAvg on deltas).

    Parameters
    ----------
    shapes : mapping of str to shape
        The model's tensors.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._sum = {k: np.zeros(s, np.float64) for k, s in shapes.items()}
        self._total = 0
        self._devices: list[str] = []

    def update(self, delta: Mapping[str, np.ndarray], weight: int, device: str) -> None:
        """Add ``weight * delta`` to the running sum (the update itself is not kept)."""
        for k, d in delta.items():
            self._sum[k] += weight * d.astype(np.float64)
        self._total += weight
        self._devices.append(device)

    def result(self) -> tuple[Delta, list[str]] | None:
        """The sum divided by the total weight."""
        if self._total == 0:
            return None
        return {k: a / self._total for k, a in self._sum.items()}, list(self._devices)


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

    def update(self, delta: Mapping[str, np.ndarray], weight: int, device: str) -> None:
        """Keep the update for the end of the round."""
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
    return RobustRule(settings.aggregation, settings.trim_fraction, settings.krum_malicious)
