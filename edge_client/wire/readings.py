"""Per-reading messages: what simple sensors publish, one reading (or a list of them) per
message, as JSON or as one bare value.

``{"ts": 1700000000.02, "ax": 0.1, "ay": 9.8, "az": 0.3, "activity": "walk"}``, or ``21.50``
(``payload = "plain"``: ESPHome's and Home Assistant's statestream's one value per topic).

A :class:`ReadingFormat` names where each channel, the timestamp and the label are:

- **channels** by field path: ``ax`` (a key), ``imu.acc.x`` (nested keys), ``acc[0]`` (an
  array element), ``acc[0:3]`` (a slice: three channels ``acc[0]``, ``acc[1]``, ``acc[2]``);
- **the timestamp** in a field (``ts`` by default): a number of seconds, milliseconds,
  microseconds or nanoseconds since the epoch (``time_unit``), or an ISO 8601 string (in
  ``time_zone``, an IANA name, when it names no zone; UTC without one). Exactly-once across
  restarts rests on it: readings of a stream are told apart by their timestamps, which must
  increase. Without a timestamp field (``time_field`` None) a reading takes its message's
  arrival (:class:`~edge_client.runtime.windowing.WindowAssembler` keeps them rising);
- **the label**, optionally, in a field: a class name from a declared list (``walk`` ->
  its index in ``classes``) or an integer class index;
- **a sequence number**, optionally, in a field: a counter the sensor increments with each
  reading (many do), which tells readings that never arrived (a gap in the counter) from a
  pause in the stream.

A value that says the sensor has none (``unavailable``, ``unknown``, ``null``: what Home
Assistant and Zigbee2MQTT publish) is not an error: a message whose every channel says so
raises :class:`MissingValueError` and is counted apart; a reading with some such channels
carries NaN in them (the assembler holds their last values for report-on-change sensors,
and counts the reading apart otherwise). Fields a reading carries beyond the channels
(``linkquality``, ``battery``) are ignored.

Decoding validates everything and raises :class:`~edge_client.wire.frames.FrameError` with a
kebab-case reason, as the sample frames do: a message is taken whole or refused whole.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from edge_client.wire.constants import (
    MAX_PAYLOAD_BYTES,
    MAX_PLAIN_BYTES,
    MISSING_VALUES,
    PAYLOADS,
    TIME_UNITS,
)
from edge_client.wire.frames import FrameError, json_items

__all__ = [
    "FieldPath",
    "MissingValueError",
    "Reading",
    "ReadingFormat",
    "availability_state",
    "decode_readings",
    "encode_readings",
    "parse_fields",
]


class MissingValueError(ValueError):
    """A message whose value says the sensor has none (``unavailable``, ``null``): counted
    (``readings-unavailable``), not refused."""


@cache
def time_zone(name: str) -> tzinfo:
    """The IANA time zone ``name`` (``Europe/Berlin``).

    Raises
    ------
    ValueError
        If no such zone is known (the ``tzdata`` package, a dependency, holds them all).
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"time zone {name!r} is not an IANA name such as Europe/Berlin") from err


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\[(\d+):(\d+)\]|(\.)")


@dataclass(frozen=True)
class FieldPath:
    """Where one value is in a reading: keys and array indices, e.g. ``imu.acc[2]``."""

    text: str
    steps: tuple[str | int, ...]

    def get(self, obj: Any) -> Any:
        """The value at this path in ``obj``.

        Raises
        ------
        KeyError
            If a key is missing or an index is out of range (named by the path).
        """
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(obj, list) or step >= len(obj):
                    raise KeyError(self.text)
            elif not isinstance(obj, dict) or step not in obj:
                raise KeyError(self.text)
            obj = obj[step]
        return obj


def parse_fields(text: str) -> tuple[FieldPath, ...]:
    """Field paths from a comma-separated list; a slice ``a[i:j]`` gives ``j - i`` paths.

    Parameters
    ----------
    text : str
        E.g. ``"ax,ay,az"``, ``"imu.acc.x,imu.acc.y"`` or ``"acc[0:3],temp"``.

    Raises
    ------
    ValueError
        If the list is empty, a path is malformed, a slice is empty, or a path repeats.
    """
    paths: list[FieldPath] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ValueError(f"fields {text!r}: an empty field name")
        paths.extend(_expand(item))
    names = [p.text for p in paths]
    if len(set(names)) != len(names):
        raise ValueError(f"fields {text!r}: a field is named twice")
    return tuple(paths)


def _expand(item: str) -> list[FieldPath]:
    steps: list[str | int] = []
    span: tuple[int, int] | None = None
    pos = 0
    expect_key = True
    for match in _STEP.finditer(item):
        if match.start() != pos or span is not None:
            break  # a character no step matches, or a step after a slice
        pos = match.end()
        key, index, lo, hi, dot = match.groups()
        if dot:
            if expect_key:
                break
            expect_key = True
        elif key is not None:
            if not expect_key:
                break
            steps.append(key)
            expect_key = False
        elif index is not None:
            if not steps:
                break
            steps.append(int(index))
        else:
            if not steps:
                break
            span = (int(lo), int(hi))
    if pos != len(item) or expect_key:
        raise ValueError(f"field {item!r}: write keys and indices as imu.acc.x, acc[0] or acc[0:3]")
    if span is None:
        return [FieldPath(item, tuple(steps))]
    lo_i, hi_i = span
    if hi_i <= lo_i:
        raise ValueError(f"field {item!r}: the slice is empty")
    base = item[: item.rindex("[")]
    return [FieldPath(f"{base}[{i}]", (*steps, i)) for i in range(lo_i, hi_i)]


@dataclass(frozen=True)
class ReadingFormat:
    """How to read one topic's per-reading JSON.

    Parameters
    ----------
    fields : tuple of FieldPath
        The channels, in order (empty on a topic that carries only labels); with ``plain``
        payloads one, the name of the message's bare value.
    time_field : FieldPath or None
        The timestamp; None: each reading is stamped with its message's arrival.
    time_unit : str
        ``s``, ``ms``, ``us`` or ``ns``: the unit of a numeric timestamp.
    payload : str
        ``json`` (per-reading JSON), ``plain`` (one bare number per message: no
        timestamp, label or counter, so ``time_field`` is None) or ``sparkplug`` (one
        metric of a Sparkplug B data topic, by name: :mod:`edge_client.wire.sparkplug`
        reads those, stateful across the edge node's messages).
    time_zone : str, optional
        IANA name of the zone an ISO 8601 timestamp without one is in (Tasmota's local
        time); None: UTC.
    label_field : FieldPath, optional
        The label; None for label-free readings.
    seq_field : FieldPath, optional
        The sensor's reading counter (an integer >= 0); None when it sends none.
    classes : tuple of str
        Class names, in index order; string labels must be one of them.
    num_classes : int
        Integer labels must lie in ``[0, num_classes)``.
    """

    fields: tuple[FieldPath, ...]
    time_field: FieldPath | None = field(default_factory=lambda: parse_fields("ts")[0])
    time_unit: str = "s"
    label_field: FieldPath | None = None
    classes: tuple[str, ...] = ()
    num_classes: int = 0
    seq_field: FieldPath | None = None
    payload: str = "json"
    time_zone: str | None = None

    def __post_init__(self) -> None:
        if self.time_unit not in TIME_UNITS:
            raise ValueError(
                f"time unit must be one of {tuple(TIME_UNITS)}, got {self.time_unit!r}"
            )
        if self.payload not in PAYLOADS:
            raise ValueError(f"payload must be one of {PAYLOADS}, got {self.payload!r}")
        if not self.fields and self.label_field is None:
            raise ValueError("a topic must carry channels, a label, or both")
        if self.payload in ("plain", "sparkplug"):  # one channel a stream, label-free
            if len(self.fields) != 1 or self.label_field or self.seq_field:
                raise ValueError(f"a {self.payload} stream is one channel, with no label")
            if self.time_field is not None:
                raise ValueError(f"a {self.payload} payload has no timestamp field")
        if self.time_zone is not None:
            time_zone(self.time_zone)


@dataclass(frozen=True, slots=True)
class Reading:
    """One decoded reading: its time, its channel values, its class index and its sequence
    number (each None where the format has none)."""

    ts: float
    values: tuple[float, ...]
    label: int | None
    seq: int | None = None


def decode_readings(
    payload: bytes | bytearray, fmt: ReadingFormat, arrival: float = math.nan
) -> list[Reading]:
    """Decode one message: per-reading JSON (an object, or a list of objects), or one bare
    value (``plain``).

    Parameters
    ----------
    payload : bytes or bytearray
        The message payload.
    fmt : ReadingFormat
        Where the channels, timestamp and label are.
    arrival : float
        When the message arrived (seconds since the epoch): the readings' time where the
        format has no timestamp field.

    Returns
    -------
    list of Reading
        In the message's order.

    Raises
    ------
    MissingValueError
        Every channel's value says the sensor has none (:data:`MISSING_VALUES`, JSON null);
        where some do, the reading carries NaN in those channels.
    FrameError
        ``empty``, ``too-large``, ``bad-utf8``, ``bad-json``, ``count-too-large``,
        ``missing-field`` (a channel, timestamp or label absent, or a channel not a number),
        ``not-a-number`` (a plain payload that is no number), ``non-finite``,
        ``bad-timestamp``, ``unknown-label`` (a class name not in the list), ``bad-label``
        (an integer label out of range, or neither name nor integer) or ``bad-sequence`` (a
        sequence number that is not an integer >= 0).
    """
    if not payload:
        raise FrameError("empty", "empty payload")
    if fmt.payload == "plain":
        return [Reading(arrival, (_bare_value(payload),), None)]
    if fmt.payload == "sparkplug":  # stateful: SparkplugReader reads the edge node's messages
        raise ValueError("Sparkplug B payloads are read by edge_client.wire.sparkplug")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FrameError("too-large", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    _, items = json_items(payload, "readings")
    return [_reading(item, fmt, arrival) for item in items]


def _bare_value(payload: bytes | bytearray) -> float:
    """A plain payload's number (``21.50``, ``"21.5"``, ``-3e2``)."""
    if len(payload) > MAX_PLAIN_BYTES:
        raise FrameError("too-large", f"{len(payload)} bytes > {MAX_PLAIN_BYTES} for one value")
    try:
        text = bytes(payload).decode("utf-8").strip().strip('"').strip()
    except UnicodeDecodeError as err:
        raise FrameError("bad-utf8", "a plain payload must be UTF-8 text") from err
    if text.lower() in MISSING_VALUES:
        raise MissingValueError(f"{text!r}")
    try:
        value = float(text)
    except ValueError:
        raise FrameError("not-a-number", f"{text!r:.40} is not a number") from None
    if not math.isfinite(value):
        raise FrameError("non-finite", "the value is NaN or infinite")
    return value


def _reading(item: Any, fmt: ReadingFormat, arrival: float) -> Reading:
    if not isinstance(item, dict):
        raise FrameError("bad-json", "each reading must be a JSON object")
    values = tuple(_number_or_nan(item, path) for path in fmt.fields)
    if values and all(math.isnan(v) for v in values):
        raise MissingValueError("no channel has a value")
    if fmt.time_field is None:
        ts = arrival
    else:
        ts = _timestamp(_get(item, fmt.time_field), fmt.time_unit, fmt.time_zone)
    label = None if fmt.label_field is None else _label(_get(item, fmt.label_field), fmt)
    seq = None if fmt.seq_field is None else _sequence(_get(item, fmt.seq_field))
    return Reading(ts, values, label, seq)


def _sequence(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise FrameError("bad-sequence", f"sequence number {value!r:.40} is not an integer >= 0")
    return value


def _get(item: dict[str, Any], path: FieldPath) -> Any:
    try:
        return path.get(item)
    except KeyError as err:
        raise FrameError("missing-field", f"no field {path.text!r}") from err


def _number_or_nan(item: dict[str, Any], path: FieldPath) -> float:
    """A channel's value; NaN where the sensor says it has none (a NaN or infinity in the
    message itself is refused)."""
    value = _get(item, path)
    if value is None or (isinstance(value, str) and value.strip().lower() in MISSING_VALUES):
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " (name its elements: field[0:n])" if isinstance(value, list) else ""
        raise FrameError("missing-field", f"{path.text!r} is not a number{hint}")
    if not math.isfinite(value):
        raise FrameError("non-finite", "a channel is NaN or infinite")
    return float(value)


def _timestamp(value: Any, unit: str, zone: str | None = None) -> float:
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError as err:
            raise FrameError("bad-timestamp", f"{value!r:.40} is not ISO 8601") from err
        if stamp.tzinfo is None:  # local time (Tasmota's): in the zone given, else UTC
            stamp = stamp.replace(tzinfo=UTC if zone is None else time_zone(zone))
        ts = stamp.timestamp()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FrameError("bad-timestamp", f"timestamp {value!r:.40} is not a number or string")
    else:
        ts = float(value) * TIME_UNITS[unit]
    if not (math.isfinite(ts) and ts >= 0):
        raise FrameError("bad-timestamp", "timestamps must be finite and non-negative")
    return ts


def _label(value: Any, fmt: ReadingFormat) -> int:
    if isinstance(value, str):
        try:
            return fmt.classes.index(value)
        except ValueError:
            raise FrameError("unknown-label", f"{value!r:.40} is not one of the classes") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < fmt.num_classes:
        raise FrameError(
            "bad-label", f"label {value!r:.40} is not a class in [0, {fmt.num_classes})"
        )
    return value


def availability_state(payload: bytes | bytearray) -> str:
    """A sensor's availability message as one word, lower case: ``online``/``offline`` as
    ESPHome, Home Assistant and Zigbee2MQTT's legacy mode publish them, Tasmota's
    ``Online``/``Offline``, Zigbee2MQTT's ``{"state": "online"}``; other text as it is
    (at most :data:`MAX_PLAIN_BYTES` characters)."""
    text = bytes(payload[: 4 * MAX_PLAIN_BYTES]).decode("utf-8", errors="replace").strip()
    if text.startswith("{"):
        try:
            state = json.loads(text).get("state")
        except (ValueError, AttributeError):
            state = None
        text = state if isinstance(state, str) else text
    return text.strip().lower()[:MAX_PLAIN_BYTES]


def encode_readings(
    ts: Sequence[float], values: Sequence[Sequence[float]], names: Sequence[str]
) -> bytes:
    """Readings as per-reading JSON, ``{"ts": ..., "<name>": value, ...}``: one object for
    one reading, a list for more (what the publisher's emulation and the benchmark send).

    Parameters
    ----------
    ts : sequence of float
        Each reading's timestamp, in seconds.
    values : sequence of sequences of float
        Each reading's channel values, in the order of ``names``.
    names : sequence of str
        The channels' field names.
    """
    objs = [
        {"ts": t, **dict(zip(names, map(float, row), strict=True))}
        for t, row in zip(ts, values, strict=True)
    ]
    return json.dumps(objs[0] if len(objs) == 1 else objs).encode()
