"""What sensors a broker carries (``fedstream sensors``), and the ``fedstream ingest``
command lines that read them.

Three ways to find them, each over one listening period:

- **Home Assistant's MQTT discovery**: every sensor announced as a retained config on
  ``homeassistant/sensor/[<node id>/]<object id>/config`` (state topic, unit, device class,
  availability topic, and a value template that says where the value is in the state
  message), abbreviated keys and the ``~`` base topic included;
- **Sparkplug B births** (``NBIRTH``/``DBIRTH``) published while listening: each device's
  numeric metrics (births are not retained: an edge node that was born before shows up
  only by its data, with its metrics unnamed until its next birth);
- **sampling**: every other topic that carried a message, with its rate and its payload's
  kind (a bare number, JSON with numeric fields, Sparkplug B).

:func:`ingest_commands` turns sensors into ``fedstream ingest`` command lines, one for each
payload kind (a daemon reads one kind), with the options each convention needs.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import paho.mqtt.client as mqtt

from deploy.subscriber import BrokerSubscriber
from edge_client.runtime.mqtt import BrokerURL
from edge_client.wire.constants import MAX_PLAIN_BYTES, SPARKPLUG_NAMESPACE
from edge_client.wire.frames import FrameError
from edge_client.wire.readings import MissingValueError, decode_readings, parse_fields
from edge_client.wire.readings import ReadingFormat as _Format
from edge_client.wire.sparkplug import NUMERIC, SparkplugTopic, decode_payload

__all__ = [
    "BrokerListener",
    "Sensor",
    "discover",
    "ingest_commands",
]

log = logging.getLogger(__name__)

HA_PREFIX = "homeassistant"
#: Home Assistant's abbreviations of the config keys read here.
_HA_KEYS = {
    "stat_t": "state_topic",
    "val_tpl": "value_template",
    "unit_of_meas": "unit_of_measurement",
    "dev_cla": "device_class",
    "avty_t": "availability_topic",
    "avty": "availability",
    "uniq_id": "unique_id",
    "obj_id": "object_id",
    "dev": "device",
    "pl_avail": "payload_available",
}
#: ``{{ value }}``, ``{{ value_json.a.b }}``, ``{{ value_json['a'] }}``, with filters after.
_TEMPLATE = re.compile(
    r"^\{\{\s*(value(?:_json((?:\.\w+|\[\s*['\"][^'\"]+['\"]\s*\]|\[\d+\])+))?)\s*(\|[^{}]*)?\}\}$"
)
#: The options a printed command takes for sensors that report on change, and a window.
REPORT_ON_CHANGE = ("--rate", "1", "--report-on-change", "--max-gap", "600", "--window", "60")
MAX_JSON_FIELDS = 64  # numeric fields listed of one sampled JSON topic


@dataclass
class Sensor:
    """One channel a broker carries.

    Attributes
    ----------
    name : str
        The channel's name for ``--fields`` (Home Assistant's object id, a JSON field's
        path, a Sparkplug metric's name).
    topic : str
        Where its values come (a Sparkplug device's ``DDATA`` topic).
    kind : str
        ``plain`` (a bare number a message), ``json`` (a field of a JSON object) or
        ``sparkplug``.
    field : str
        Its place in the message: the JSON path, the metric's name; empty for ``plain``.
    source : str
        How it was found: ``homeassistant``, ``sparkplug`` or ``sample``.
    unit, device_class, device, availability : str or None
        What a discovery config says: unit, device class, the device's name, its
        availability topic.
    rate : float or None
        Messages a second on its topic while listening (None: none came).
    note : str
        Why it cannot be read as it is, if it cannot (empty otherwise).
    """

    name: str
    topic: str
    kind: str
    field: str = ""
    source: str = "sample"
    unit: str | None = None
    device_class: str | None = None
    device: str | None = None
    availability: str | None = None
    rate: float | None = None
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        """Kebab-case keys, as every record of fedstream."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}


@dataclass
class _Seen:
    first: float
    last: float
    count: int = 0
    payload: bytes = b""
    retained: bool = False


class BrokerListener(BrokerSubscriber):
    """Listens to topic filters and keeps, per topic, the last message and how many came.

    Parameters
    ----------
    broker : BrokerURL
        The broker (a :class:`~edge_client.runtime.mqtt.BrokerOptions` for credentials).
    filters : sequence of str
        What to subscribe to.
    """

    def __init__(self, broker: BrokerURL, filters: Sequence[str]) -> None:
        super().__init__(broker, filters, "fedstream-sensors")
        self.seen: dict[str, _Seen] = {}
        self.births: list[tuple[str, bytes]] = []  # Sparkplug B births, in order
        self._lock = threading.Lock()

    def snapshot(self) -> tuple[dict[str, _Seen], list[tuple[str, bytes]]]:
        """What came so far: per topic, and the births."""
        with self._lock:
            return dict(self.seen), list(self.births)

    def on_message(self, msg: mqtt.MQTTMessage) -> None:
        """Count the message on its topic, keep it as the topic's last (and a birth)."""
        now = time.monotonic()
        with self._lock:
            seen = self.seen.setdefault(msg.topic, _Seen(now, now))
            seen.count += 1
            seen.last = now
            seen.payload = bytes(msg.payload)
            seen.retained = seen.retained or bool(msg.retain)
            kind = msg.topic.split("/")[2:3]
            if msg.topic.startswith(SPARKPLUG_NAMESPACE + "/") and kind in (["NBIRTH"], ["DBIRTH"]):
                self.births.append((msg.topic, bytes(msg.payload)))


def filters_of(mode: str) -> tuple[str, ...]:
    """The subscriptions of a ``--discovery`` mode."""
    ha = (f"{HA_PREFIX}/sensor/+/config", f"{HA_PREFIX}/sensor/+/+/config")
    spb = (f"{SPARKPLUG_NAMESPACE}/+/NBIRTH/+", f"{SPARKPLUG_NAMESPACE}/+/DBIRTH/+/+")
    return {"homeassistant": ha, "sparkplug": spb, "sample": ("#",), "all": ("#",)}[mode]


# -- reading what came ---------------------------------------------------------------------


def discover(
    seen: dict[str, _Seen],
    births: Iterable[tuple[str, bytes]],
    seconds: float,
    mode: str = "all",
) -> list[Sensor]:
    """The sensors in what a :class:`BrokerListener` heard over ``seconds``.

    Home Assistant configs and Sparkplug births name sensors; with ``all`` or ``sample``
    every other topic that carried a message is classified by its payload. A config's
    state topic that also carried messages gets their rate.
    """
    sensors: list[Sensor] = []
    configs = {t: s for t, s in seen.items() if _is_ha_config(t)}
    if mode in ("all", "homeassistant"):
        for topic, s in sorted(configs.items()):
            sensor = ha_sensor(topic, s.payload)
            if sensor is not None:
                sensors.append(sensor)
    named_topics = {s.topic for s in sensors}
    if mode in ("all", "sparkplug"):
        found = sparkplug_sensors(births)
        sensors += found
        named_topics |= {s.topic for s in found}
    if mode in ("all", "sample"):
        for topic, s in sorted(seen.items()):
            if topic in configs or topic in named_topics or topic.startswith("$"):
                continue
            if topic.startswith(SPARKPLUG_NAMESPACE + "/"):
                continue  # Sparkplug B is read from births (its data names no metric)
            sensors += sampled_sensors(topic, s.payload)
    for sensor in sensors:  # the rate each topic carried while listening
        carried = seen.get(sensor.topic)
        if carried is not None and not carried.retained and seconds > 0:
            sensor.rate = round(carried.count / seconds, 3)
    if mode in ("all", "sparkplug"):
        sensors += _unborn_sparkplug(seen, named_topics)
    return sensors


def _is_ha_config(topic: str) -> bool:
    levels = topic.split("/")
    return levels[0] == HA_PREFIX and levels[-1] == "config" and len(levels) in (4, 5)


def ha_sensor(topic: str, payload: bytes) -> Sensor | None:
    """The sensor a Home Assistant discovery config announces (None: not a sensor config,
    or an empty one, which removes a sensor)."""
    levels = topic.split("/")
    if len(levels) not in (4, 5) or levels[1] != "sensor" or not payload:
        return None
    try:
        raw = json.loads(payload)
    except ValueError:
        return Sensor(levels[-2], topic, "plain", source="homeassistant", note="config not JSON")
    if not isinstance(raw, dict):
        return None
    config = {_HA_KEYS.get(str(k), str(k)): v for k, v in raw.items()}
    base = config.get("~")
    if isinstance(base, str):  # "~" stands for the base topic at either end of a topic
        for key in ("state_topic", "availability_topic"):
            value = config.get(key)
            if isinstance(value, str):
                config[key] = (
                    base + value[1:]
                    if value.startswith("~")
                    else value[:-1] + base
                    if value.endswith("~")
                    else value
                )
    name = _channel_name(config.get("object_id") or levels[-2])
    state = config.get("state_topic")
    device = config.get("device")
    sensor = Sensor(
        name,
        state if isinstance(state, str) else "",
        "plain",
        source="homeassistant",
        unit=_text(config.get("unit_of_measurement")),
        device_class=_text(config.get("device_class")),
        device=_text(device.get("name")) if isinstance(device, dict) else None,
        availability=_availability_topic(config),
    )
    if not sensor.topic:
        sensor.note = "no state topic"
        return sensor
    template = config.get("value_template")
    if template is None:
        return sensor
    match = _TEMPLATE.match(str(template).strip())
    if match is None:
        sensor.note = f"value template {str(template)[:60]!r} is not read"
    elif match.group(2):
        sensor.kind, sensor.field = "json", _path(match.group(2))
    return sensor


def _path(steps: str) -> str:
    """``.a['b'][0]`` -> ``a.b[0]``: a field path of ``--fields``."""
    parts = re.findall(r"\.(\w+)|\[\s*['\"]([^'\"]+)['\"]\s*\]|\[(\d+)\]", steps)
    out = ""
    for key, quoted, index in parts:
        out += f"[{index}]" if index else (("." if out else "") + (key or quoted))
    return out


def _availability_topic(config: dict[str, Any]) -> str | None:
    topic = config.get("availability_topic")
    if isinstance(topic, str):
        return topic
    listed = config.get("availability")
    if isinstance(listed, list) and listed and isinstance(listed[0], dict):
        first = listed[0].get("topic") or listed[0].get("t")
        return first if isinstance(first, str) else None
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _channel_name(text: Any) -> str:
    """A name ``--fields`` takes: letters, digits, ``_`` and ``-``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", str(text)).strip("_") or "sensor"


def sparkplug_sensors(births: Iterable[tuple[str, bytes]]) -> list[Sensor]:
    """Each numeric metric a Sparkplug B birth names, on its data topic."""
    out: dict[tuple[str, str], Sensor] = {}
    for topic, payload in births:
        try:
            where = SparkplugTopic.parse(topic)
            birth = decode_payload(payload)
        except FrameError:
            continue
        kind = "DDATA" if where.device else "NDATA"
        tail = f"/{where.device}" if where.device else ""
        data = f"{SPARKPLUG_NAMESPACE}/{where.group}/{kind}/{where.node}{tail}"
        for metric in birth.metrics:
            if not metric.HasField("name") or metric.name == "bdSeq":
                continue
            numeric = metric.datatype in NUMERIC
            out[(data, metric.name)] = Sensor(
                metric.name,
                data,
                "sparkplug",
                field=metric.name,
                source="sparkplug",
                device=f"{where.node}{tail}",
                note="" if numeric else f"datatype {metric.datatype} is no number",
            )
    return list(out.values())


def _unborn_sparkplug(seen: dict[str, _Seen], named: set[str]) -> list[Sensor]:
    """Sparkplug B data topics seen without a birth: listed, their metrics unknown."""
    out = []
    for topic in sorted(seen):
        levels = topic.split("/")
        if (
            topic in named
            or levels[0] != SPARKPLUG_NAMESPACE
            or levels[2:3]
            not in (
                ["DDATA"],
                ["NDATA"],
            )
        ):
            continue
        out.append(
            Sensor(
                "?",
                topic,
                "sparkplug",
                source="sample",
                note="no birth seen: listen again while the edge node is born, or ingest "
                "with --sparkplug-rebirth",
            )
        )
    return out


def sampled_sensors(topic: str, payload: bytes) -> list[Sensor]:
    """The channels one sampled message shows: a bare number (one channel, named by the
    topic's last level), or a JSON object's numeric fields (nested ones by path)."""
    if len(payload) <= MAX_PLAIN_BYTES:
        try:
            value = decode_readings(payload, _Format(parse_fields("v"), None, payload="plain"))
            if value:
                return [Sensor(_channel_name(topic.split("/")[-1]), topic, "plain")]
        except (FrameError, MissingValueError):
            pass
    try:
        obj = json.loads(payload)
    except ValueError:
        return []
    paths = _numeric_paths(obj, "")[:MAX_JSON_FIELDS] if isinstance(obj, dict) else []
    return [Sensor(p, topic, "json", field=p) for p in paths]


def _numeric_paths(obj: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for key, value in obj.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(key)):
            continue  # a key a field path cannot name
        path = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append(path)
        elif isinstance(value, dict):
            out += _numeric_paths(value, path + ".")
    return out


# -- the command lines ---------------------------------------------------------------------


@dataclass
class Command:
    """A ``fedstream ingest`` command line and the sensors it reads."""

    argv: list[str]
    sensors: list[Sensor] = field(default_factory=list)


def select(sensors: Sequence[Sensor], patterns: Sequence[str]) -> list[Sensor]:
    """The sensors whose name, topic or device matches one of the shell-style
    ``patterns`` (all without any), readable ones only."""
    readable = [s for s in sensors if not s.note]
    if not patterns:
        return readable
    return [
        s
        for s in readable
        if any(
            fnmatch.fnmatchcase(value, p)
            for p in patterns
            for value in (s.name, s.topic, s.device or "")
        )
    ]


def ingest_commands(
    sensors: Sequence[Sensor], broker: str, device_id: str, buffer: str
) -> list[Command]:
    """``fedstream ingest`` command lines that read ``sensors``: one for each payload kind
    (and each Sparkplug B device), each reading its sensors' channels in order.

    Channel names are made unique (``_2``, ... appended) where two sensors share one.
    """
    by_kind: dict[str, list[Sensor]] = defaultdict(list)
    for s in sensors:
        key = s.kind if s.kind != "sparkplug" else f"sparkplug {s.topic}"
        by_kind[key].append(s)
    commands = []
    many = len(by_kind) > 1
    for n, (key, group) in enumerate(sorted(by_kind.items()), start=1):
        dev = f"{device_id}-{n}" if many else device_id
        buf = buffer.replace(".sqlite", f"-{n}.sqlite") if many else buffer
        argv = ["fedstream", "ingest", "--broker", broker, "--device-id", dev, "--buffer", buf]
        if key == "plain":
            names = _unique([s.name for s in group])
            argv += ["--payload", "plain", "--time-field", "none"]
            for s, name in zip(group, names, strict=True):
                argv += ["--topic", f"{s.topic}={name}"]
        elif key == "json":
            argv += ["--time-field", "none"]
            topics: dict[str, list[str]] = defaultdict(list)
            for s in group:
                topics[s.topic].append(s.field)
            for topic, fields in topics.items():
                argv += ["--topic", f"{topic}={','.join(dict.fromkeys(fields))}"]
        else:
            argv += ["--payload", "sparkplug", "--topic", group[0].topic]
            argv += ["--fields", ",".join(dict.fromkeys(s.field for s in group))]
        argv += list(REPORT_ON_CHANGE)
        for topic in dict.fromkeys(s.availability for s in group if s.availability):
            argv += ["--availability-topic", str(topic)]
        commands.append(Command(argv, list(group)))
    return commands


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
