"""Sparkplug B, the industrial MQTT convention, read into per-metric readings.

An edge node publishes on ``spBv1.0/<group>/<type>/<edge node>[/<device>]``: ``NBIRTH`` and
``DBIRTH`` name its metrics (each with an alias and a datatype, and its current value),
``NDATA`` and ``DDATA`` then carry values by alias (each metric with its own timestamp, in
milliseconds), ``NDEATH`` (the broker's will) and ``DDEATH`` say it or a device went away.
Every message of an edge node but ``NDEATH`` carries a sequence number, 0-255, counted
across all its message types and devices from its ``NBIRTH``: a gap is a lost message.

Payloads are decoded with the specification's own schema, Eclipse Tahu's
``sparkplug_b.proto`` (EPL-2.0; its notice is in the file, beside this module), compiled by
``dev/sparkplug_proto.sh`` into :mod:`edge_client.wire.sparkplug_b_pb2`: no wire format is
written by hand here.

:class:`SparkplugReader` follows one data topic (a device's ``DDATA``, or a node's
``NDATA``) and the messages of its edge node: aliases and datatypes learnt from the births,
the sequence counted, deaths noted, and a data message whose aliases are not known yet held
(bounded) until the birth that names them. Numeric scalar metrics (the integer types, float,
double, boolean as 0/1) named in ``--fields`` become readings; other metrics are ignored.
"""

from __future__ import annotations

import base64
import math
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from edge_client.wire.constants import (
    MAX_PAYLOAD_BYTES,
    MAX_SPARKPLUG_ID,
    MAX_SPARKPLUG_METRICS,
    SPARKPLUG_HELD_BYTES,
    SPARKPLUG_HELD_MAX,
    SPARKPLUG_NAMESPACE,
    SPARKPLUG_REBIRTH_METRIC,
    SPARKPLUG_REBIRTH_S,
)
from edge_client.wire.frames import FrameError
from edge_client.wire.readings import MissingValueError, Reading
from edge_client.wire.sparkplug_b_pb2 import DataType, Payload

__all__ = [
    "SparkplugReader",
    "SparkplugTopic",
    "decode_payload",
    "encode_metrics",
    "metric_number",
    "rebirth_request",
]

#: Message types, by what they are about.
NODE_TYPES = ("NBIRTH", "NDEATH", "NDATA", "NCMD")
DEVICE_TYPES = ("DBIRTH", "DDEATH", "DDATA", "DCMD")
#: Signed integer datatypes and their width: the schema keeps them in unsigned fields
#: (two's complement), as Tahu's clients write them.
_SIGNED_BITS = {DataType.Int8: 8, DataType.Int16: 16, DataType.Int32: 32, DataType.Int64: 64}
_UNSIGNED = (DataType.UInt8, DataType.UInt16, DataType.UInt32, DataType.UInt64)
_FLOATS = (DataType.Float, DataType.Double)
#: Datatypes read as numbers.
NUMERIC = frozenset((*_SIGNED_BITS, *_UNSIGNED, *_FLOATS, DataType.Boolean))


@dataclass(frozen=True)
class SparkplugTopic:
    """A Sparkplug B topic: group, message type, edge node and (device messages) device."""

    group: str
    kind: str
    node: str
    device: str | None = None

    @classmethod
    def parse(cls, topic: str) -> SparkplugTopic:
        """Parse ``spBv1.0/<group>/<type>/<edge node>[/<device>]``.

        Raises
        ------
        FrameError
            ``bad-topic``: not a Sparkplug B topic of a node or device message type.
        """
        levels = topic.split("/")
        if any(len(level) > MAX_SPARKPLUG_ID for level in levels):
            raise FrameError(
                "bad-topic", f"a level of {topic[:80]!r}... is over {MAX_SPARKPLUG_ID}"
            )
        if len(levels) not in (4, 5) or levels[0] != SPARKPLUG_NAMESPACE:
            raise FrameError("bad-topic", f"{topic[:80]!r} is not a Sparkplug B topic")
        _, group, kind, node, *device = levels
        expected = NODE_TYPES if not device else DEVICE_TYPES
        if kind not in expected or not group or not node or (device and not device[0]):
            raise FrameError(
                "bad-topic", f"{topic[:80]!r} is not a Sparkplug B node or device topic"
            )
        return cls(group, kind, node, device[0] if device else None)

    @classmethod
    def data(cls, topic: str) -> SparkplugTopic:
        """The data topic a user names (``--topic``): a device's ``DDATA`` or a node's
        ``NDATA``, without wildcards.

        Raises
        ------
        ValueError
            If it is neither (the message says what to write).
        """
        hint = (
            f"--payload sparkplug: --topic {topic!r} must name one data topic, "
            f"{SPARKPLUG_NAMESPACE}/GROUP/DDATA/EDGE-NODE/DEVICE or "
            f"{SPARKPLUG_NAMESPACE}/GROUP/NDATA/EDGE-NODE"
        )
        if "+" in topic or "#" in topic:
            raise ValueError(hint)
        try:
            parsed = cls.parse(topic)
        except FrameError:
            raise ValueError(hint) from None
        if parsed.kind not in ("DDATA", "NDATA"):
            raise ValueError(hint)
        return parsed

    @property
    def subscriptions(self) -> tuple[str, str]:
        """What to subscribe to for this topic's edge node: all its node messages and all
        its devices' (the sequence number runs across them all)."""
        base = f"{SPARKPLUG_NAMESPACE}/{self.group}/+/{self.node}"
        return (base, f"{base}/+")

    def command_topic(self) -> str:
        """The edge node's ``NCMD`` topic (a rebirth request goes there)."""
        return f"{SPARKPLUG_NAMESPACE}/{self.group}/NCMD/{self.node}"


def decode_payload(payload: bytes | bytearray) -> Payload:
    """A Sparkplug B payload, parsed with Tahu's schema.

    Raises
    ------
    FrameError
        ``empty``, ``too-large``, ``bad-protobuf`` (not a Sparkplug B payload) or
        ``too-many-metrics`` (more than :data:`MAX_SPARKPLUG_METRICS`).
    """
    if not payload:
        raise FrameError("empty", "empty payload")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FrameError("too-large", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    message = Payload()
    try:
        message.ParseFromString(bytes(payload))
    except DecodeError as err:
        raise FrameError("bad-protobuf", f"not a Sparkplug B payload: {err}") from None
    known = ("timestamp", "seq", "uuid", "body")
    if not message.metrics and not any(message.HasField(f) for f in known):
        # protobuf reads many byte strings as some message (all fields unknown): none of
        # Sparkplug's is no Sparkplug B payload
        raise FrameError("bad-protobuf", "not a Sparkplug B payload: none of its fields")
    if len(message.metrics) > MAX_SPARKPLUG_METRICS:
        raise FrameError(
            "too-many-metrics", f"{len(message.metrics)} metrics > {MAX_SPARKPLUG_METRICS}"
        )
    return message


def metric_number(metric: Payload.Metric, datatype: int) -> float:
    """A numeric scalar metric's value.

    Raises
    ------
    MissingValueError
        The metric says it has no value (``is_null``).
    FrameError
        ``not-a-number``: its datatype is no numeric scalar, or its value field does not
        match it; ``non-finite``: NaN or infinite.
    """
    if metric.is_null:
        raise MissingValueError("is_null")
    field = metric.WhichOneof("value")
    if datatype in _SIGNED_BITS:
        bits = _SIGNED_BITS[datatype]  # type: ignore[index]
        raw = metric.long_value if field == "long_value" else metric.int_value
        if field not in ("int_value", "long_value"):
            raise FrameError("not-a-number", f"metric {metric.name!r:.40} has no integer value")
        raw &= (1 << bits) - 1
        value = float(raw - (1 << bits) if raw >= 1 << (bits - 1) else raw)
    elif datatype in _UNSIGNED:
        if field not in ("int_value", "long_value"):
            raise FrameError("not-a-number", f"metric {metric.name!r:.40} has no integer value")
        value = float(metric.long_value if field == "long_value" else metric.int_value)
    elif datatype in _FLOATS:
        if field not in ("float_value", "double_value"):
            raise FrameError("not-a-number", f"metric {metric.name!r:.40} has no float value")
        value = metric.double_value if field == "double_value" else metric.float_value
    elif datatype == DataType.Boolean:
        if field != "boolean_value":
            raise FrameError("not-a-number", f"metric {metric.name!r:.40} has no boolean value")
        value = 1.0 if metric.boolean_value else 0.0
    else:
        raise FrameError("not-a-number", f"datatype {datatype} is no numeric scalar")
    if not math.isfinite(value):
        raise FrameError("non-finite", "the value is NaN or infinite")
    return value


def encode_metrics(
    metrics: Sequence[tuple[str | None, int | None, int, float, int]],
    seq: int | None,
    timestamp_ms: int,
) -> bytes:
    """A payload of metrics ``(name, alias, datatype, value, timestamp in ms)``: a birth
    names them (and gives aliases), a data message may give aliases only. For replays and
    tests (:mod:`edge_client.emulation.reading_styles`); datatypes Double, Float, the
    integer types and Boolean."""
    payload = Payload(timestamp=timestamp_ms)
    if seq is not None:
        payload.seq = seq
    for name, alias, datatype, value, ts in metrics:
        metric = payload.metrics.add(timestamp=ts, datatype=datatype)
        if name is not None:
            metric.name = name
        if alias is not None:
            metric.alias = alias
        if datatype in _FLOATS:
            if datatype == DataType.Double:
                metric.double_value = value
            else:
                metric.float_value = value
        elif datatype == DataType.Boolean:
            metric.boolean_value = bool(value)
        else:
            number = int(value)
            bits = _SIGNED_BITS.get(datatype, 0)  # type: ignore[call-overload]
            if bits and number < 0:
                number += 1 << bits
            if datatype in (DataType.Int64, DataType.UInt64):
                metric.long_value = number
            else:
                metric.int_value = number
    return bytes(payload.SerializeToString())


def rebirth_request() -> bytes:
    """An ``NCMD`` payload asking an edge node to publish its births again."""
    return encode_metrics(
        [(SPARKPLUG_REBIRTH_METRIC, None, DataType.Boolean, 1.0, _now_ms())], None, _now_ms()
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class SparkplugReader:
    """One data topic's metrics out of its edge node's messages.

    Parameters
    ----------
    topic : SparkplugTopic
        The data topic (``DDATA`` of a device, or ``NDATA`` of the node).
    names : sequence of str
        The metrics to read, in channel order.

    Notes
    -----
    :meth:`take` returns ``(channel index, Reading)`` pairs and a Counter of what it saw:
    ``sparkplug-lost`` (messages missing by sequence number), ``sparkplug-out-of-order``,
    ``sparkplug-held`` (data messages held for unknown aliases), ``sparkplug-held-dropped``,
    ``sparkplug-births``, ``sparkplug-deaths``, ``readings-unavailable`` (null metrics).
    """

    def __init__(self, topic: SparkplugTopic, names: Sequence[str]) -> None:
        self.topic = topic
        self.names = tuple(names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self.expected: int | None = None  # the next sequence number; None before any
        self.aliases: dict[int, str] = {}  # alias -> metric name, of the topic's device
        self.types: dict[str, int] = {}  # metric name -> datatype, from its birth
        self.node_online: bool | None = None  # None: no birth or death seen yet
        self.online: bool | None = None  # the device's (the node's for NDATA)
        self.held: deque[tuple[str, bytes, float]] = deque()
        self._asked_rebirth = -math.inf

    # -- what the ingest daemon calls ---------------------------------------------------

    def take(
        self, topic: str, payload: bytes | bytearray, arrival: float
    ) -> tuple[list[tuple[int, Reading]], Counter[str]]:
        """Read one message of the edge node.

        Raises
        ------
        FrameError
            A topic or payload that is not Sparkplug B (``bad-topic``, ``bad-protobuf``,
            ``too-many-metrics``, ``too-large``), or a metric the fields name with a value
            that is no number (``not-a-number``, ``non-finite``).
        """
        where = SparkplugTopic.parse(topic)
        if (where.group, where.node) != (self.topic.group, self.topic.node):
            raise FrameError("bad-topic", f"{topic[:80]!r} is another edge node's")
        counts: Counter[str] = Counter()
        if where.kind in ("NCMD", "DCMD"):
            return [], counts  # commands to the node (a rebirth request, ours or another's)
        message = decode_payload(payload)
        if where.kind == "NDEATH":  # the broker's will: no sequence number
            self.node_online = False
            self.online = False
            counts["sparkplug-deaths"] += 1
            return [], counts
        self._count_sequence(where.kind, message, counts)
        ours = where.device == self.topic.device
        if where.kind == "NBIRTH":
            self.node_online = True
            if self.topic.device is not None:  # a new session: the device births again
                self.aliases, self.types, self.online = {}, {}, None
        if not ours:
            return [], counts
        if where.kind == "DDEATH":
            self.online = False
            counts["sparkplug-deaths"] += 1
            return [], counts
        if where.kind in ("NBIRTH", "DBIRTH"):
            counts["sparkplug-births"] += 1
            self.online = True
            self._learn(message)
            readings = self._readings(message, arrival, counts)
            for _kind, held, at in self._release():
                readings += self._readings(decode_payload(held), at, counts)
            return readings, counts
        if self._unknown_alias(message):  # DDATA / NDATA before the birth that names it
            self._hold(where.kind, bytes(payload), arrival, counts)
            return [], counts
        return self._readings(message, arrival, counts), counts

    def _hold(self, kind: str, payload: bytes, arrival: float, counts: Counter[str]) -> None:
        """Keep a data message for the birth that names its aliases: at most
        :data:`SPARKPLUG_HELD_MAX` messages and :data:`SPARKPLUG_HELD_BYTES` bytes (they go
        into the buffer file's state), the oldest dropped first."""
        counts["sparkplug-held"] += 1
        if len(payload) > SPARKPLUG_HELD_BYTES:
            counts["sparkplug-held-dropped"] += 1
            return
        held = sum(len(data) for _, data, _ in self.held)
        while self.held and (
            len(self.held) >= SPARKPLUG_HELD_MAX or held + len(payload) > SPARKPLUG_HELD_BYTES
        ):
            held -= len(self.held.popleft()[1])
            counts["sparkplug-held-dropped"] += 1
        self.held.append((kind, payload, arrival))

    def rebirth_due(self, now: float) -> bool:
        """Whether to ask the edge node for its births now: data is held for aliases no
        birth named, and no request went out within :data:`SPARKPLUG_REBIRTH_S`."""
        if not self.held or now - self._asked_rebirth < SPARKPLUG_REBIRTH_S:
            return False
        self._asked_rebirth = now
        return True

    @property
    def status(self) -> dict[str, Any]:
        """What ``fedstream status`` shows of the edge node (JSON-ready)."""
        return {
            "edge-node": f"{self.topic.group}/{self.topic.node}",
            "device": self.topic.device,
            "node-online": self.node_online,
            "online": self.online,
            "metrics-known": sorted(self.types),
            "held": len(self.held),
        }

    def state(self) -> dict[str, Any]:
        """What :meth:`restore` continues from (JSON-ready): births are not repeated after
        a restart, so their aliases are kept."""
        return {
            "expected": self.expected,
            "aliases": [[alias, name] for alias, name in sorted(self.aliases.items())],
            "types": dict(sorted(self.types.items())),
            "node-online": self.node_online,
            "online": self.online,
            "held": [[kind, base64.b64encode(data).decode(), at] for kind, data, at in self.held],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self.expected = state.get("expected")
        self.aliases = {int(alias): str(name) for alias, name in state.get("aliases", [])}
        self.types = {str(k): int(v) for k, v in state.get("types", {}).items()}
        self.node_online = state.get("node-online")
        self.online = state.get("online")
        self.held = deque(
            (str(kind), base64.b64decode(data), float(at))
            for kind, data, at in state.get("held", [])
        )

    # -- the rules ----------------------------------------------------------------------

    def _count_sequence(self, kind: str, message: Payload, counts: Counter[str]) -> None:
        if not message.HasField("seq"):
            return
        seq = message.seq % 256
        if kind == "NBIRTH" or self.expected is None:  # a new session, or the first seen
            self.expected = (seq + 1) % 256
            return
        gap = (seq - self.expected) % 256
        if gap > 128:  # behind the expected: a redelivery or a late one, not a loss
            counts["sparkplug-out-of-order"] += 1
            return
        counts["sparkplug-lost"] += gap
        self.expected = (seq + 1) % 256

    def _learn(self, birth: Payload) -> None:
        self.aliases, self.types = {}, {}
        for metric in birth.metrics:
            if not metric.HasField("name"):
                continue
            self.types[metric.name] = metric.datatype
            if metric.HasField("alias"):
                self.aliases[metric.alias] = metric.name

    def _name(self, metric: Payload.Metric) -> str | None:
        if metric.HasField("name"):
            return metric.name
        return self.aliases.get(metric.alias) if metric.HasField("alias") else None

    def _unknown_alias(self, message: Payload) -> bool:
        return any(self._name(m) is None for m in message.metrics)

    def _release(self) -> list[tuple[str, bytes, float]]:
        """The held messages a birth has now named (the rest stay held)."""
        named: list[tuple[str, bytes, float]] = []
        still: deque[tuple[str, bytes, float]] = deque()
        for kind, data, at in self.held:
            known = not self._unknown_alias(decode_payload(data))
            (named if known else still).append((kind, data, at))
        self.held = still
        return named

    def _readings(
        self, message: Payload, arrival: float, counts: Counter[str]
    ) -> list[tuple[int, Reading]]:
        out = []
        sent = message.timestamp / 1000 if message.HasField("timestamp") else arrival
        for metric in message.metrics:
            name = self._name(metric)
            index = self._index.get(name) if name is not None else None
            if index is None or name is None:
                continue  # a metric the fields do not name
            datatype = metric.datatype if metric.HasField("datatype") else self.types.get(name)
            if datatype not in NUMERIC:
                raise FrameError("not-a-number", f"metric {name!r:.40} is no numeric scalar")
            try:
                value = metric_number(metric, int(datatype))
            except MissingValueError:
                counts["readings-unavailable"] += 1
                continue
            ts = metric.timestamp / 1000 if metric.HasField("timestamp") else sent
            out.append((index, Reading(ts, (value,), None)))
        return out
