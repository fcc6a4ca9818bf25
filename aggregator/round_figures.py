"""A committed round's figures as every sink gets them (:mod:`aggregator.sinks`,
:mod:`aggregator.prometheus_sink`): the run's and each replying device's, by kebab-case
name, NaN left out."""

from __future__ import annotations

import math

from aggregator.round_log import RoundRecord
from edge_client.wire.mapping import kebab

__all__ = ["flat_figures", "round_figures"]

#: The fields of a device's reply (:class:`~edge_client.wire.records.ReplyMetrics`) a sink gets.
_DEVICE_FIGURES = ("batch_size", "compute_s", "step_s", "stream_rate", "buffer_fill")


def round_figures(record: RoundRecord) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A round's figures, by kebab-case name: the run's, and each replying device's.

    Returns
    -------
    tuple of dict
        Run figures (``accuracy`` and ``loss``: prequential, the task's metric;
        ``test-accuracy``, ``test-loss``: on ``eval-data``, absent without; ``wall-s``,
        ``bytes-up``, ``devices``, ``sum-b``, ``skipped`` 1 or 0; asynchronous mode:
        ``staleness-max``, ``staleness-mean``; differential privacy: ``dp-epsilon-spent``;
        secure aggregation: ``secagg-survivors``, ``secagg-dropped``),
        and per device ``batch-size``,
        ``compute-s``, ``step-s``, ``stream-rate``, ``buffer-fill`` (asynchronous mode:
        ``staleness`` of its last update). NaN figures are left out.
    """
    run = {
        "accuracy": record.accuracy,
        "loss": record.loss,
        "test-accuracy": record.test_accuracy,
        "test-loss": record.test_loss,
        "wall-s": record.wall_s,
        kebab("bytes_up"): float(record.bytes_up),
        "devices": float(record.replied_count),
        "sum-b": float(record.sum_b),
        "skipped": 1.0 if record.skipped else 0.0,
    }
    if record.dp_epsilon_spent is not None:
        run[kebab("dp_epsilon_spent")] = record.dp_epsilon_spent
    if record.secagg_survivors is not None:
        run[kebab("secagg_survivors")] = float(record.secagg_survivors)
        run[kebab("secagg_dropped")] = float(record.secagg_dropped or 0)
    staleness: dict[str, float] = {}
    for update in record.updates:
        staleness[update.device] = float(update.staleness)
    if record.updates:
        values = [u.staleness for u in record.updates]
        run["staleness-max"] = float(max(values))
        run["staleness-mean"] = sum(values) / len(values)
    devices = {}
    for device, m in record.devices.items():
        figures = {kebab(name): float(getattr(m, name)) for name in _DEVICE_FIGURES}
        if device in staleness:
            figures["staleness"] = staleness[device]
        devices[device] = _finite(figures)
    return _finite(run), devices


def flat_figures(record: RoundRecord) -> dict[str, float]:
    """:func:`round_figures` in one mapping, as TensorBoard and MLflow log them: the run's
    under their name, a device's under ``device/<id>/<name>``."""
    run, devices = round_figures(record)
    figures = dict(run)
    for device, values in devices.items():
        figures.update({f"device/{device}/{k}": v for k, v in values.items()})
    return figures


def _finite(figures: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if math.isfinite(v)}
