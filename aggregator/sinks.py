"""Where each round's figures go besides ``metrics.jsonl``: a Prometheus endpoint
(``prometheus-port``), TensorBoard (``tensorboard-dir``) and MLflow (``mlflow-uri``), each
through its own library and each off unless its run-config key is set.

Every sink gets the same figures of a committed round
(:func:`~aggregator.round_figures.round_figures`), after its checkpoint and its line of
``metrics.jsonl``: the run's own record stays the source of truth, and a sink that fails
logs a warning and is dropped instead of stopping the training.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from aggregator.round_figures import flat_figures
from aggregator.round_log import RoundRecord
from edge_client.wire.settings_groups import SinkSettings

__all__ = [
    "MlflowSink",
    "RoundSink",
    "TensorBoardSink",
    "open_sinks",
    "write_all",
]

log = logging.getLogger(__name__)


class RoundSink(Protocol):
    """Takes each committed round's record."""

    def write(self, record: RoundRecord) -> None:
        """Log ``record``."""

    def close(self) -> None:
        """Flush and release what the sink holds (at the end of the run)."""


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
        for name, value in flat_figures(record).items():
            self._writer.add_scalar(name, value, record.round)
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

    def __init__(self, uri: str, experiment: str, params: Mapping[str, Any]) -> None:
        try:
            import mlflow
        except ImportError as err:
            raise ValueError("mlflow-uri needs MLflow: pip install mlflow") from err
        self._mlflow: Any = mlflow
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment)
        self._run = mlflow.start_run()
        mlflow.log_params({k: str(v) for k, v in params.items()})

    def write(self, record: RoundRecord) -> None:
        self._mlflow.log_metrics(flat_figures(record), step=record.round)

    def close(self) -> None:
        self._mlflow.end_run()


def open_sinks(settings: SinkSettings, run_config: Mapping[str, Any]) -> list[RoundSink]:
    """The sinks ``settings`` ask for (none by default); ``run_config``: the run's, which
    MLflow logs as the run's parameters.

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
            sinks.append(MlflowSink(settings.mlflow_uri, settings.mlflow_experiment, run_config))
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
