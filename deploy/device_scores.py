"""Per-device scores: the device a model serves worst, not only the fleet's average.

Each round every device scores the model it received on the samples it then trains on
(prequential: ``eval-metric`` in its reply, in ``metrics.jsonl``). Across the devices of a
round, or across each device's latest score, :func:`fleet_scores` gives the mean, the median
and the worst 10 %: the mean of the worst tenth of the devices (at least one), "worst" by the
task's metric (the lowest accuracy, the highest forecast error), as federated-learning papers
report fairness.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aggregator.round_log import RoundRecord

__all__ = ["FleetScores", "fleet_scores", "latest_scores", "round_scores"]


@dataclass(frozen=True)
class FleetScores:
    """The distribution of the devices' scores (by the task's metric).

    Attributes
    ----------
    mean, median : float
        Over the devices.
    worst10 : float
        The mean of the worst 10 % of the devices (at least one).
    devices : int
        How many devices it is over.
    """

    mean: float
    median: float
    worst10: float
    devices: int


def round_scores(record: RoundRecord) -> dict[str, float]:
    """Each device's prequential score in ``record`` (devices that scored no sample left out)."""
    return {
        device: float(m.eval_metric)
        for device, m in record.devices.items()
        if m.eval_count > 0 and math.isfinite(m.eval_metric)
    }


def latest_scores(records: Sequence[RoundRecord]) -> dict[str, float]:
    """Each device's score in the last round it reported one."""
    latest: dict[str, float] = {}
    for record in records:
        latest.update(round_scores(record))
    return latest


def fleet_scores(scores: Mapping[str, float], higher_is_better: bool = True) -> FleetScores | None:
    """The mean, median and worst 10 % of ``scores`` (None for no device)."""
    values = sorted(scores.values(), reverse=not higher_is_better)  # the worst first
    if not values:
        return None
    tenth = values[: max(1, math.ceil(len(values) / 10))]
    return FleetScores(
        statistics.fmean(values), statistics.median(values), statistics.fmean(tenth), len(values)
    )
