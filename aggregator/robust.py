"""Byzantine-robust aggregation of decoded updates, with Flower's own rules.

``aggregation`` in the run config picks the rule. ``fedavg`` (the default) is the streaming
sample-weighted mean (:class:`aggregator.aggregation.WeightedMean`, aggregator memory
O(model)). The rules here need every update of the round at once (memory O(devices x
model), :class:`aggregator.aggregation.RobustRule`) and weigh devices equally or by
selection, not by samples used:

- ``trimmed-mean``: per coordinate, drop the ``trim-fraction`` largest and smallest values
  and average the rest (Flower's ``FedTrimmedAvg``);
- ``median``: per-coordinate median (Flower's ``FedMedian``);
- ``krum``: the one update closest to its ``n - f - 2`` nearest neighbours, with ``f`` =
  ``krum-malicious`` (Flower's ``Krum``);
- ``multi-krum``: the ``n - f`` best-scoring updates, averaged by samples used (Flower's
  ``MultiKrum``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from edge_client.wire.constants import ROBUST_AGGREGATIONS

__all__ = ["robust_aggregate"]

Delta = dict[str, np.ndarray]


def robust_aggregate(
    rule: str,
    deltas: Sequence[Delta],
    weights: Sequence[int],
    trim_fraction: float = 0.2,
    malicious: int = 1,
) -> tuple[Delta, list[int]]:
    """Combine one round's updates with a robust rule.

    Parameters
    ----------
    rule : str
        ``trimmed-mean``, ``median``, ``krum`` or ``multi-krum``.
    deltas : sequence of dict
        The decoded updates (name -> array), all with the same names and shapes.
    weights : sequence of int
        Samples each update was trained on, > 0 (used by ``multi-krum``'s average).
    trim_fraction : float
        ``trimmed-mean``: fraction cut at each end, in [0, 0.5).
    malicious : int
        ``krum`` / ``multi-krum``: how many updates may be hostile (``f``).

    Returns
    -------
    tuple
        (combined update, indices of the updates it kept: all for the coordinate-wise
        rules, the selected ones for Krum).

    Raises
    ------
    ValueError
        On an unknown rule, no updates, or a bad parameter.
    """
    if rule not in ROBUST_AGGREGATIONS:
        raise ValueError(f"robust rule must be one of {ROBUST_AGGREGATIONS}, got {rule!r}")
    if not deltas or len(deltas) != len(weights) or min(weights) <= 0:
        raise ValueError("need at least one update and one positive weight per update")
    names = list(deltas[0])
    if rule in ("trimmed-mean", "median"):
        stacked = {k: np.stack([d[k].astype(np.float64) for d in deltas]) for k in names}
        if rule == "median":
            return {k: np.median(v, axis=0) for k, v in stacked.items()}, list(range(len(deltas)))
        return (
            {k: np.asarray(trim_mean(v, trim_fraction)) for k, v in stacked.items()},
            list(range(len(deltas))),
        )
    if malicious < 0:
        raise ValueError(f"krum-malicious must be >= 0, got {malicious}")
    keep = 1 if rule == "krum" else max(1, len(deltas) - malicious)
    contents = [
        RecordDict({"d": ArrayRecord({k: Array(np.asarray(d[k], np.float32)) for k in names})})
        for d in deltas
    ]
    chosen = select_multikrum(contents, malicious, keep)
    picked = [next(i for i, c in enumerate(contents) if c is ch) for ch in chosen]
    total = sum(weights[i] for i in picked)
    combined = {
        k: np.sum([weights[i] * deltas[i][k].astype(np.float64) for i in picked], axis=0) / total
        for k in names
    }
    return combined, sorted(picked)
