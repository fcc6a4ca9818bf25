"""The aggregator's per-round figures as Prometheus metrics (run config ``prometheus-port``):
the last committed round's accuracy, bytes, wall time and devices, and per device its batch,
compute time and, in asynchronous mode, the staleness of its last update.

Gauges hold the last round's value; ``_total`` counters add up over the run (from this
process's start: a resumed run starts them again, as Prometheus counters do on a restart).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from aggregator.round_figures import round_figures
from aggregator.round_log import RoundRecord
from edge_client.wire.mapping import kebab

__all__ = ["METRIC_NAMES", "RoundExporter"]

#: Run figure (of :func:`~aggregator.round_figures.round_figures`) -> (gauge name, help).
_RUN_GAUGES = {
    "accuracy": ("fedstream_accuracy", "Prequential score (the task's metric), last round."),
    "loss": ("fedstream_loss", "Prequential loss, last round."),
    "test-accuracy": ("fedstream_test_accuracy", "Score on eval-data, last round."),
    "wall-s": ("fedstream_round_wall_seconds", "Wall time of the last round."),
    "devices": ("fedstream_round_devices", "Devices that replied in the last round."),
    "dp-epsilon-spent": (
        "fedstream_dp_epsilon_spent",
        "Differential privacy: epsilon spent at dp-delta after the last round (NaN: no DP).",
    ),
    kebab("secagg_survivors"): (
        "fedstream_secagg_survivors",
        "Secure aggregation: devices whose update is in the last round's sum.",
    ),
    kebab("secagg_dropped"): (
        "fedstream_secagg_dropped",
        "Secure aggregation: devices that trained in the last round but are not in its sum.",
    ),
}
#: Device figure -> (gauge name, help); the device label is added.
_DEVICE_GAUGES = {
    kebab("batch_size"): (
        "fedstream_device_batch_size",
        "The device's batch, last round it trained.",
    ),
    kebab("compute_s"): (
        "fedstream_device_compute_seconds",
        "The device's training time, last round.",
    ),
    "staleness": ("fedstream_device_staleness", "Staleness of the device's last update (async)."),
}
_ROUND = "fedstream_round"
_BYTES_UP = "fedstream_bytes_up"
_SKIPPED = "fedstream_rounds_skipped"

#: Every metric name the aggregator's endpoint exports (counters with their ``_total``).
METRIC_NAMES: tuple[str, ...] = (
    _ROUND,
    *(name for name, _ in _RUN_GAUGES.values()),
    *(name for name, _ in _DEVICE_GAUGES.values()),
    f"{_BYTES_UP}_total",
    f"{_SKIPPED}_total",
)


class RoundExporter:
    """Serves the last committed round's figures on ``http://listen:port/metrics``.

    Raises
    ------
    OSError
        If the port cannot be bound.
    """

    def __init__(self, port: int, listen: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._round = Gauge(_ROUND, "Last committed round (async: model version).", registry=r)
        self._run = {k: Gauge(n, h, registry=r) for k, (n, h) in _RUN_GAUGES.items()}
        self._device = {
            k: Gauge(n, h, ["device"], registry=r) for k, (n, h) in _DEVICE_GAUGES.items()
        }
        self._bytes_up = Counter(_BYTES_UP, "Update bytes received.", registry=r)
        self._skipped = Counter(_SKIPPED, "Rounds skipped, by reason.", ["reason"], registry=r)
        try:
            self._server, _thread = start_http_server(port, addr=listen, registry=r)
        except OSError as err:
            raise OSError(
                f"prometheus-port: cannot serve on {listen}:{port}: {err.strerror}"
            ) from err

    def write(self, record: RoundRecord) -> None:
        run, devices = round_figures(record)
        self._round.set(record.round)
        for key, gauge in self._run.items():
            gauge.set(run.get(key, float("nan")))  # NaN: none this round (e.g. no eval-data)
        for device, figures in devices.items():
            for key, gauge in self._device.items():
                if key in figures:
                    gauge.labels(device).set(figures[key])
        self._bytes_up.inc(record.bytes_up)
        if record.skipped:
            self._skipped.labels(record.skipped).inc()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
