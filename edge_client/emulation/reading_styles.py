"""A series' readings the way devices people already have publish them (``fedstream publish
--readings --style``), for tests, docs and the demo:

- ``json``: fedstream's per-reading JSON, ``{"ts": ..., "<channel>": value}`` (the default);
- ``esphome``: one bare value per channel and reading, on the channel's own topic
  (``esphome/<device>/sensor/<channel>/state`` -> ``21.5``), no timestamp;
- ``zigbee2mqtt``: one JSON object per reading without a timestamp, with a field beyond the
  channels (``zigbee2mqtt/<device>`` -> ``{"temperature": 21.5, "linkquality": 120}``);
- ``tasmota``: a reading's channels under a sensor's name, stamped with a local time that
  names no zone (``tele/<device>/SENSOR`` -> ``{"Time": "2026-12-05T05:55:00",
  "SENSOR": {"temperature": 21.5}}``), in ``time_zone``;
- ``sparkplug``: Sparkplug B (:class:`SparkplugEdge`): an ``NBIRTH``, then a ``DBIRTH``
  naming the channels as Double metrics with aliases (and the first reading's values), then
  one ``DDATA`` a reading by alias, each metric stamped with the reading's time, the
  sequence number running on mod 256.

What ``fedstream ingest`` options read each back: :func:`ingest_options`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from edge_client.wire.constants import SPARKPLUG_NAMESPACE
from edge_client.wire.readings import encode_readings, time_zone
from edge_client.wire.sparkplug import SparkplugTopic, encode_metrics
from edge_client.wire.sparkplug_b_pb2 import DataType

__all__ = ["STYLES", "SparkplugEdge", "default_topic", "encode_style", "ingest_options"]

#: The conventions ``--style`` replays.
STYLES = ("json", "esphome", "zigbee2mqtt", "tasmota", "sparkplug")
#: The Sparkplug B group a replay publishes in (its edge node is the device's id).
SPARKPLUG_GROUP = "fedstream"
#: The Sparkplug B device a replay's channels belong to.
SPARKPLUG_DEVICE = "sensors"
#: Zigbee2MQTT's link quality, a field every message carries beside the sensor's.
LINKQUALITY = 120
#: The name Tasmota files a reading's channels under (its sensor's: ``BME280``, ``SHT3X``).
TASMOTA_SENSOR = "SENSOR"


def default_topic(style: str, device_id: str) -> str | None:
    """Where a device of ``style`` publishes (``+``: the channel's level); None for ``json``
    (fedstream's own topic)."""
    return {
        "esphome": f"esphome/{device_id}/sensor/+/state",
        "zigbee2mqtt": f"zigbee2mqtt/{device_id}",
        "tasmota": f"tele/{device_id}/SENSOR",
        "sparkplug": f"{SPARKPLUG_NAMESPACE}/{SPARKPLUG_GROUP}/DDATA/{device_id}/"
        f"{SPARKPLUG_DEVICE}",
    }.get(style)


def encode_style(
    style: str,
    topic: str,
    stamps: Sequence[float],
    rows: Sequence[Sequence[float]],
    names: Sequence[str],
    zone: str | None = None,
) -> list[tuple[str, bytes]]:
    """Readings as ``style``'s messages: (topic, payload) pairs, in order.

    Parameters
    ----------
    style : str
        One of :data:`STYLES`.
    topic : str
        The device's topic (:func:`default_topic`); for ``esphome`` with a ``+`` level.
    stamps, rows, names : sequences
        The readings' times (s), their values, and the channels' names.
    zone : str, optional
        ``tasmota``: the IANA zone its local times are in (default UTC).

    Raises
    ------
    ValueError
        If the style is unknown, or an ``esphome`` topic has no ``+`` level.
    """
    if style == "json":
        return [(topic, encode_readings(stamps, rows, names))]
    if style == "esphome":
        levels = topic.split("/")
        if "+" not in levels:
            raise ValueError(f"--style esphome: topic {topic!r} needs a + for the channel's level")
        return [
            (topic.replace("+", name, 1), repr(float(v)).encode())
            for row in rows
            for name, v in zip(names, row, strict=True)
        ]
    if style == "zigbee2mqtt":
        return [
            (topic, json.dumps({**_channels(names, row), "linkquality": LINKQUALITY}).encode())
            for row in rows
        ]
    if style == "tasmota":
        where = time_zone(zone or "UTC")
        return [
            (
                topic,
                json.dumps(
                    {
                        "Time": datetime.fromtimestamp(ts, where)
                        .replace(tzinfo=None)
                        .isoformat(timespec="microseconds"),
                        TASMOTA_SENSOR: _channels(names, row),
                    }
                ).encode(),
            )
            for ts, row in zip(stamps, rows, strict=True)
        ]
    if style == "sparkplug":
        return SparkplugEdge(topic, names).messages(stamps, rows)
    raise ValueError(f"--style {style!r}: one of {', '.join(STYLES)}")


class SparkplugEdge:
    """An edge node that publishes readings as Sparkplug B: births first, then data.

    Parameters
    ----------
    topic : str
        The device's data topic, ``spBv1.0/<group>/DDATA/<edge node>/<device>``.
    names : sequence of str
        The channels: the metrics' names (aliases 1, 2, ... in this order).

    Raises
    ------
    ValueError
        If ``topic`` is no device data topic.
    """

    def __init__(self, topic: str, names: Sequence[str]) -> None:
        self.topic = SparkplugTopic.data(topic)
        if self.topic.device is None:
            raise ValueError(f"--style sparkplug: {topic!r} must be a device's DDATA topic")
        self.names = list(names)
        self.seq = 0  # the next message's sequence number (an NBIRTH's is 0)
        self.born = False

    def messages(
        self, stamps: Sequence[float], rows: Sequence[Sequence[float]]
    ) -> list[tuple[str, bytes]]:
        """(topic, payload) pairs for these readings: the first ever in the births (a birth
        carries its metrics' current values), each other in a ``DDATA``."""
        out: list[tuple[str, bytes]] = []
        for ts, row in zip(stamps, rows, strict=True):
            if not self.born:
                out += self.births(ts, row)
                continue
            ms = round(ts * 1000)
            metrics = [
                (None, alias, DataType.Double, float(v), ms) for alias, v in enumerate(row, start=1)
            ]
            out.append((self._topic("DDATA"), encode_metrics(metrics, self._next(), ms)))
        return out

    def births(self, ts: float, row: Sequence[float]) -> list[tuple[str, bytes]]:
        """The edge node's ``NBIRTH`` (sequence 0) and its device's ``DBIRTH``: the channels'
        names, aliases and datatypes, and their values ``row`` at ``ts``."""
        self.born, self.seq = True, 0
        ms = round(ts * 1000)
        node = encode_metrics([("bdSeq", None, DataType.Int64, 0.0, ms)], self._next(), ms)
        metrics = [
            (name, alias, DataType.Double, float(v), ms)
            for alias, (name, v) in enumerate(zip(self.names, row, strict=True), start=1)
        ]
        device = encode_metrics(metrics, self._next(), ms)
        return [(self._topic("NBIRTH"), node), (self._topic("DBIRTH"), device)]

    def _next(self) -> int:
        seq, self.seq = self.seq, (self.seq + 1) % 256
        return seq

    def _topic(self, kind: str) -> str:
        t = self.topic
        node = f"{SPARKPLUG_NAMESPACE}/{t.group}/{kind}/{t.node}"
        return node if kind.startswith("N") else f"{node}/{t.device}"


def _channels(names: Sequence[str], row: Sequence[float]) -> dict[str, float]:
    return {name: float(v) for name, v in zip(names, row, strict=True)}


def ingest_options(
    style: str, topic: str, names: Sequence[str], zone: str | None = None
) -> list[str]:
    """The ``fedstream ingest`` options that read ``style``'s messages on ``topic`` back as
    the channels ``names`` (the windowing options, ``--window`` and ``--rate``, are the
    caller's: several ESPHome topics need ``--rate``)."""
    fields = ",".join(names)
    if style == "esphome":
        return ["--payload", "plain", "--time-field", "none", "--topic", topic, "--fields", fields]
    if style == "zigbee2mqtt":
        return ["--time-field", "none", "--topic", topic, "--fields", fields]
    if style == "tasmota":
        nested = ",".join(f"{TASMOTA_SENSOR}.{name}" for name in names)
        return ["--time-field", "Time", "--topic", topic, "--fields", nested] + (
            ["--time-zone", zone] if zone else []
        )
    if style == "sparkplug":
        return ["--payload", "sparkplug", "--topic", topic, "--fields", fields]
    return ["--topic", topic, "--fields", fields]
