"""Run reports: summary.json and report.png from a run's rounds (``metrics.jsonl``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.round_log import RoundRecord, rounds_only
from deploy.breakdown import run_breakdown
from deploy.device_scores import fleet_scores, latest_scores, round_scores
from deploy.extras import require_extra

if TYPE_CHECKING:  # matplotlib is the demo extra's: imported where a figure is drawn
    from matplotlib.axes import Axes

__all__ = ["in_round_order", "summarize", "training_time", "write_report"]


def summarize(records: Sequence[RoundRecord], wall_s: float) -> dict[str, Any]:
    """Summary of a run: final scores, times, and per-device batch and compute series.

    The scores are by the task's metric, which ``metric`` names (``accuracy``, or ``mae``
    for forecasting: an error in the stream's units, lower is better); the keys keep their
    names whatever it is. ``final_accuracy`` and ``accuracy`` (per round) are prequential
    (the devices' scores of the model each received, on the samples they then trained on);
    ``test_accuracy`` is the aggregator's held-out score of the last model, on ``eval-data``
    (None without). ``diverged_per_round`` counts the devices whose training diverged in
    each round, ``diverged_rounds`` how many rounds in a row up to the last did (a run ends
    with an error once that reaches ``max-diverged-rounds``).
    ``virtual_s`` sums each round's slowest device (compute + wait + transfer): the
    synchronous round time on the virtual clock, whatever the wall clock did (asynchronous
    mode: the time between aggregations), and the timing probe's record before round 1
    (``probe_virtual_s``, 0 without a probe) is in it; every per-round series is of rounds
    only. In asynchronous mode ``rounds`` counts model versions. ``planned_per_round``,
    ``replied_per_round`` and ``aggregated_per_round`` count the devices of each round;
    under differential privacy without ``dp-device-records`` they are all the summary
    holds of them (``devices_hidden``: ``devices``, ``rejected`` and the device scores empty).

    Per device (:mod:`deploy.device_scores`): ``device_scores`` holds each device's latest
    prequential score, ``device_score_mean``, ``device_score_median`` and
    ``device_score_worst10`` (the mean of the worst tenth) their distribution (None without
    scores), ``device_score_per_round`` the same for each round; ``test_by_group`` the
    aggregator's last score per group of ``eval-data`` (``eval-group-by``).
    """
    every, records = records, in_round_order(records)
    devices = sorted({d for r in records for d in r.devices})
    last = records[-1] if records else None
    return {
        **_device_scores(records),
        "final_accuracy": _number(last.accuracy) if last else None,
        "test_accuracy": _number(last.test_accuracy) if last else None,
        "metric": last.metric if last else None,
        "higher_is_better": last.higher_is_better if last else True,
        "rounds": len(records),
        "wall_s": round(wall_s, 2),
        "virtual_s": round(sum(r.virtual_s for r in every), 4),
        "probe_virtual_s": round(
            sum(r.virtual_s for r in every) - sum(r.virtual_s for r in records), 4
        ),
        "accuracy": [_number(r.accuracy) for r in records],
        "test_accuracy_per_round": [_number(r.test_accuracy) for r in records],
        "evaluated_samples": [r.eval_count for r in records],
        "bytes_up": sum(r.bytes_up for r in records),
        "broadcast_bytes_per_round": [r.broadcast_bytes for r in records],
        "compress_modes": [r.compress for r in records],
        "inject_bytes_per_round": [r.inject_bytes for r in records],
        "inject_bytes": sum(r.inject_bytes for r in records),
        # Differential privacy: the epsilon spent at dp-delta (None without DP).
        "dp_epsilon_spent": last.dp_epsilon_spent if last else None,
        "dp_epsilon_spent_per_round": [r.dp_epsilon_spent for r in records],
        # Secure aggregation: devices in each round's sum, and those lost (None without it).
        "secagg_survivors_per_round": [r.secagg_survivors for r in records],
        "secagg_dropped_per_round": [r.secagg_dropped for r in records],
        # Asynchronous mode: each update's staleness (versions old), and updates per device.
        "staleness": dict(sorted(Counter(u.staleness for r in records for u in r.updates).items())),
        "updates": dict(sorted(Counter(u.device for r in records for u in r.updates).items())),
        # Where the wall time went (synchronous rounds; see deploy.breakdown).
        "breakdown": run_breakdown(records),
        "rejected": last.rejected if last else {},
        "rejected_reasons": last.rejected_reasons if last else {},
        # The round's counts (what a private run keeps of its devices, devices_hidden).
        "planned_per_round": [r.planned_count for r in records],
        "replied_per_round": [r.replied_count for r in records],
        "aggregated_per_round": [r.aggregated_count for r in records],
        "devices_hidden": any(r.devices_hidden for r in records),
        "diverged_per_round": [r.diverged for r in records],
        "diverged_rounds": last.diverged_rounds if last else 0,
        "devices": {
            d: {
                "batch_size": [_of(r, d, "batch_size") for r in records],
                "compute_s": [_of(r, d, "compute_s") for r in records],
                "planned_batch": [r.planned.get(d) for r in records],
                "bytes_up": [_of(r, d, "bytes_up") for r in records],
            }
            for d in devices
        },
    }


def _device_scores(records: Sequence[RoundRecord]) -> dict[str, Any]:
    """The summary's per-device score keys (see :func:`summarize`)."""
    better = records[-1].higher_is_better if records else True
    latest = latest_scores(records)
    fleet = fleet_scores(latest, better)
    per_round = [fleet_scores(round_scores(r), better) for r in records]
    return {
        "device_score_mean": None if fleet is None else fleet.mean,
        "device_score_median": None if fleet is None else fleet.median,
        "device_score_worst10": None if fleet is None else fleet.worst10,
        "device_scores": dict(sorted(latest.items())),
        "device_score_per_round": {
            key: [None if f is None else getattr(f, key) for f in per_round]
            for key in ("mean", "median", "worst10")
        },
        "test_by_group": dict(records[-1].test_by_group) if records else {},
    }


def _number(value: float) -> float | None:
    """``value``, or None for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value


def _of(record: RoundRecord, device: str, name: str) -> Any:
    """A device's reported value in a round (None when it did not reply)."""
    metrics = record.devices.get(device)
    return None if metrics is None else getattr(metrics, name)


def in_round_order(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """The rounds of ``records`` by round, the last record of a round kept (a resumed run
    appends to the same ``metrics.jsonl``: a round run again after a crash appears twice)."""
    last = {r.round: r for r in rounds_only(records)}
    return [last[k] for k in sorted(last)]


def training_time(records: Sequence[RoundRecord]) -> list[float]:
    """Each round's end on the run's cumulative training time, in seconds: the rounds'
    ``wall-s`` summed in round order. Unlike ``run-wall-s``, which starts again at 0 when a
    run is resumed, it never runs backwards."""
    total, ends = 0.0, []
    for record in records:
        total += record.wall_s
        ends.append(round(total, 3))
    return ends


def write_report(records: Sequence[RoundRecord], path: Path, title: str = "") -> None:
    """Plot accuracy vs time and per-device batch size and compute time per round.

    Raises
    ------
    MissingExtraError
        If matplotlib (the ``demo`` extra) is not installed.
    """
    require_extra("a run's plots", ("matplotlib",))
    from deploy.plots import Panel, save_figure

    records = in_round_order(records)
    rounds = [r.round for r in records]
    devices = sorted({d for r in records for d in r.devices})
    spent = records[-1].dp_epsilon_spent if records else None
    if spent is not None:  # a private run says what it spent
        title = f"{title} (differential privacy: epsilon {spent:.2f} spent)".strip()

    metric = records[-1].metric if records else "accuracy"
    better = records[-1].higher_is_better if records else True
    spread = [fleet_scores(round_scores(r), better) for r in records]

    def draw(axes: list[Axes]) -> None:
        wall = training_time(records)
        axes[0].plot(wall, [r.accuracy for r in records], marker="o", label="prequential")
        if any(not math.isnan(r.test_accuracy) for r in records):
            axes[0].plot(wall, [r.test_accuracy for r in records], marker="s", label="test set")
        for d in devices:
            axes[1].plot(rounds, [_of(r, d, "batch_size") for r in records], marker=".", label=d)
            axes[2].plot(rounds, [_of(r, d, "compute_s") for r in records], marker=".", label=d)
        for key, label in (("mean", "mean"), ("median", "median"), ("worst10", "worst 10 %")):
            values = [math.nan if f is None else getattr(f, key) for f in spread]
            axes[3].plot(rounds, values, marker=".", label=label)

    limits = (0, 1) if metric == "accuracy" else None
    panels = [  # an accuracy is in [0, 1]; another metric (a forecast's MAE) in its units
        Panel("training time (s, resumes included)", metric, ylim=limits),
        Panel("round", "batch size"),
        Panel("round", "compute time per round (s)"),
        Panel("round", f"devices' {metric} (prequential)", ylim=limits),
    ]
    save_figure(path, panels, draw, width=5.0, title=title, dpi=90)
