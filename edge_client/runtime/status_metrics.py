"""Devices' statuses as Prometheus metrics: what the ingest daemon serves on
``--metrics-port`` (its own device) and ``fedstream fleet --prometheus-port`` (every device
whose retained status it reads from the broker).

The metrics are made at scrape time from the statuses as they stand (the ingest daemon's
retained status message, :meth:`~edge_client.runtime.buffer.BufferStore.stats` plus
``device-id``, ``online``, ``ts``), so both endpoints export the same names with a ``device``
label. Counters carry the status's running counts (they survive a daemon restart: they live
in the buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "METRIC_NAMES",
    "StatusCollector",
    "serve_registry",
    "serve_statuses",
    "status_number",
]

#: Status key -> (metric name, help) of the gauges; the device label is added.
_GAUGES = {
    "rate": ("fedstream_device_stream_rate", "Estimated stream rate (samples/s)."),
    "fill": ("fedstream_device_buffer_fill", "Samples in the device's buffer."),
    "capacity": ("fedstream_device_buffer_capacity", "Samples the buffer holds at most."),
    "fill-fraction": ("fedstream_device_buffer_fill_ratio", "Buffer fill over capacity."),
    "ts": (
        "fedstream_device_last_seen_timestamp_seconds",
        "Unix time of the device's last status.",
    ),
    # A gauge: a message that arrives late after all is taken off again.
    "messages-missing": (
        "fedstream_device_messages_missing",
        "Messages of fedstream publishers that never arrived (gaps in their sequence numbers).",
    ),
}
#: Status key -> (counter name without _total, help).
_COUNTERS = {
    "accepted": ("fedstream_device_samples_accepted", "Samples accepted into the buffer."),
    "dropped": ("fedstream_device_samples_dropped", "Samples the buffer's policy dropped."),
    "consumed": ("fedstream_device_samples_consumed", "Samples trained on."),
    "readings-missing": (
        "fedstream_device_readings_missing",
        "Readings missing inside per-reading streams at the declared rate.",
    ),
    "sparkplug-lost": (
        "fedstream_device_sparkplug_lost",
        "Messages of a Sparkplug B edge node lost (gaps in its sequence numbers).",
    ),
}
_ONLINE = "fedstream_device_online"
_ERROR = "fedstream_device_error"
_REFUSED = "fedstream_device_samples_refused"
_DRIFT = "fedstream_device_drift_changes"

#: Every metric name the device endpoints export (counters with their ``_total``).
METRIC_NAMES: tuple[str, ...] = (
    _ONLINE,
    _ERROR,
    *(name for name, _ in _GAUGES.values()),
    *(f"{name}_total" for name, _ in _COUNTERS.values()),
    f"{_REFUSED}_total",
    f"{_DRIFT}_total",
)


class StatusCollector(Collector):
    """Devices' statuses as metrics, read at each scrape. A status comes from the network
    (``fedstream fleet``): a value of the wrong type is left out, not an error.

    Parameters
    ----------
    statuses : callable
        Returns the statuses to export: device id -> status dict (the retained status
        message's JSON). A status lacking a key exports nothing for it.
    """

    def __init__(self, statuses: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._statuses = statuses

    def collect(self) -> Iterator[Metric]:
        """The metrics of the statuses as they stand now."""
        statuses = self._statuses()
        online = GaugeMetricFamily(_ONLINE, "1 while the device is online.", labels=["device"])
        error = GaugeMetricFamily(
            _ERROR, "1 while the device reports an error (e.g. its buffer).", labels=["device"]
        )
        gauges = {k: GaugeMetricFamily(n, h, labels=["device"]) for k, (n, h) in _GAUGES.items()}
        counters = {
            k: CounterMetricFamily(n, h, labels=["device"]) for k, (n, h) in _COUNTERS.items()
        }
        refused = CounterMetricFamily(
            _REFUSED, "Samples refused, by reason.", labels=["device", "reason"]
        )
        drift = CounterMetricFamily(
            _DRIFT, "Changes the device's drift watcher detected.", labels=["device"]
        )
        for device, status in sorted(statuses.items()):
            online.add_metric([device], 1.0 if status.get("online") is True else 0.0)
            error.add_metric([device], 1.0 if status.get("error") else 0.0)
            for families in (gauges, counters):
                for key, family in families.items():
                    if (value := status_number(status.get(key))) is not None:
                        family.add_metric([device], value)
            by_reason = status.get("rejected-by-reason")
            for reason, count in by_reason.items() if isinstance(by_reason, dict) else ():
                if (value := status_number(count)) is not None:
                    refused.add_metric([device, str(reason)], value)
            drift_status = status.get("drift")
            changes = drift_status.get("changes") if isinstance(drift_status, dict) else None
            if (value := status_number(changes)) is not None:
                drift.add_metric([device], value)
        yield online
        yield error
        yield from gauges.values()
        yield from counters.values()
        yield refused
        yield drift


def serve_statuses(
    port: int, statuses: Callable[[], Mapping[str, Mapping[str, Any]]], addr: str = "0.0.0.0"
) -> WSGIServer:
    """Serve ``statuses`` as Prometheus metrics on ``http://addr:port/metrics`` from a
    background thread, with a registry of their own (no process metrics of the caller).

    Returns
    -------
    WSGIServer
        The server: ``shutdown()`` stops it.

    Raises
    ------
    OSError
        If the port cannot be bound (the message names it).
    """
    registry = CollectorRegistry()
    registry.register(StatusCollector(statuses))
    return serve_registry(registry, port, addr)


def serve_registry(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a background thread.

    Raises
    ------
    OSError
        If the port cannot be bound (the message names it).
    """
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as err:
        raise OSError(f"cannot serve metrics on {addr}:{port}: {err.strerror or err}") from err
    return server


def status_number(value: object) -> float | None:
    """A status's value as a number, None where it holds none (a status may come from the
    network: a string or a bool reads as unknown)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
