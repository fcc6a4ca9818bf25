"""Where each round's figures go besides ``metrics.jsonl``: a Prometheus endpoint
(``prometheus-port``), TensorBoard (``tensorboard-dir``) and MLflow (``mlflow-uri``), each
through its own library and each off unless its run-config key is set.

Every sink gets the same figures of a committed round (:func:`round_figures`), after its
checkpoint and its line of ``metrics.jsonl``: the run's own record stays the source of truth,
and a sink that fails logs a warning and is dropped instead of stopping the training.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

from aggregator.round_log import RoundRecord
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = [
    "MlflowSink",
    "RoundSink",
    "TensorBoardSink",
    "open_sinks",
    "round_figures",
    "write_all",
]

log = logging.getLogger(__name__)

#: The fields of a device's reply (:class:`~edge_client.wire.records.ReplyMetrics`) a sink gets.
_DEVICE_FIGURES = ("batch_size", "compute_s", "step_s", "stream_rate", "buffer_fill")


class RoundSink(Protocol):
    """Takes each committed round's record."""

    def write(self, record: RoundRecord) -> None:
        """Log ``record``."""

    def close(self) -> None:
        """Flush and release what the sink holds (at the end of the run)."""


def round_figures(record: RoundRecord) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A round's figures, by kebab-case name: the run's, and each replying device's.

    Returns
    -------
    tuple of dict
        Run figures (``accuracy`` and ``loss``: prequential, the task's metric;
        ``test-accuracy``, ``test-loss``: on ``eval-data``, absent without; ``wall-s``,
        ``bytes-up``, ``devices``, ``sum-b``, ``skipped`` 1 or 0; asynchronous mode:
        ``staleness-max``, ``staleness-mean``), and per device ``batch-size``,
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
        "devices": float(len(record.devices)),
        "sum-b": float(record.sum_b),
        "skipped": 1.0 if record.skipped else 0.0,
    }
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


class TensorBoardSink:
    """Each round's figures as TensorBoard scalars (step: the round), in ``log_dir``: run
    figures under their name, a device's under ``device/<id>/<name>``.

    Raises
    ------
    ValueError
        If TensorBoard is not installed.
    """

    def __init__(self, log_dir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ValueError(
                "tensorboard-dir needs TensorBoard: pip install 'fedstream[tracking]'"
            ) from err
        self._writer = SummaryWriter(log_dir=log_dir)

    def write(self, record: RoundRecord) -> None:
        run, devices = round_figures(record)
        for name, value in run.items():
            self._writer.add_scalar(name, value, record.round)
        for device, figures in devices.items():
            for name, value in figures.items():
                self._writer.add_scalar(f"device/{device}/{name}", value, record.round)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MlflowSink:
    """Each round's figures as MLflow metrics (step: the round) in one MLflow run, with the
    run config as its parameters: run figures under their name, a device's under
    ``device/<id>/<name>``.

    Raises
    ------
    ValueError
        If MLflow is not installed.
    """

    def __init__(self, settings: RunSettings) -> None:
        try:
            import mlflow
        except ImportError as err:
            raise ValueError("mlflow-uri needs MLflow: pip install mlflow") from err
        self._mlflow: Any = mlflow
        mlflow.set_tracking_uri(settings.mlflow_uri)
        mlflow.set_experiment(settings.mlflow_experiment)
        self._run = mlflow.start_run()
        mlflow.log_params({k: str(v) for k, v in settings.to_run_config().items()})

    def write(self, record: RoundRecord) -> None:
        run, devices = round_figures(record)
        figures = dict(run)
        for device, values in devices.items():
            figures.update({f"device/{device}/{k}": v for k, v in values.items()})
        self._mlflow.log_metrics(figures, step=record.round)

    def close(self) -> None:
        self._mlflow.end_run()


def open_sinks(settings: RunSettings) -> list[RoundSink]:
    """The sinks ``settings`` ask for (none by default).

    Raises
    ------
    ValueError
        If a sink's library is missing (the message says what to install).
    OSError
        If the Prometheus port cannot be bound.
    """
    sinks: list[RoundSink] = []
    try:
        if settings.prometheus_port:
            from aggregator.prometheus_sink import RoundExporter

            sinks.append(RoundExporter(settings.prometheus_port, settings.prometheus_listen))
        if settings.tensorboard_dir:
            sinks.append(TensorBoardSink(settings.tensorboard_dir))
        if settings.mlflow_uri:
            sinks.append(MlflowSink(settings))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def write_all(sinks: list[RoundSink], record: RoundRecord) -> None:
    """Give ``record`` to every sink; a sink that fails is logged and dropped."""
    for sink in list(sinks):
        try:
            sink.write(record)
        except Exception as err:  # a dashboard must not stop the training
            log.warning("%s failed (%s): it gets no more rounds", type(sink).__name__, err)
            sinks.remove(sink)


def _finite(figures: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if math.isfinite(v)}
