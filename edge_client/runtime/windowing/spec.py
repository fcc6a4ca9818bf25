"""What the ingest daemon makes of per-reading streams: topics, channels, windows, labels."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from edge_client.runtime.constants import (
    DEFAULT_LABEL_WAIT_S,
    DEFAULT_MAX_GAP_S,
    DEFAULT_MAX_SKEW_S,
    NO_TIME_FIELD,
)
from edge_client.wire.readings import FieldPath, ReadingFormat, parse_fields
from edge_client.wire.sparkplug import SparkplugTopic

__all__ = ["StreamSpec", "WindowSpec", "parse_topic"]


@dataclass(frozen=True)
class StreamSpec:
    """One subscribed topic (MQTT wildcards allowed) and what its readings carry."""

    topic: str
    format: ReadingFormat

    @property
    def channels(self) -> int:
        """Channels this topic contributes to a sample."""
        return len(self.format.fields)

    @property
    def key(self) -> str:
        """What tells the stream from the others: its topic (a Sparkplug B metric's topic
        and name: a device's metrics share its data topic)."""
        if self.format.payload == "sparkplug":
            return f"{self.topic}#{self.format.fields[0].text}"
        return self.topic


def parse_topic(option: str) -> tuple[str, str | None]:
    """Split a ``--topic`` value: ``TOPIC`` or ``TOPIC=FIELDS`` (fields of that topic).

    Raises
    ------
    ValueError
        If the topic is empty or holds ``=`` twice.
    """
    topic, sep, fields = option.partition("=")
    if not topic.strip() or "=" in fields or (sep and not fields.strip()):
        raise ValueError(f"--topic {option!r}: write TOPIC or TOPIC=field1,field2")
    return topic.strip(), fields.strip() if sep else None


@dataclass(frozen=True)
class WindowSpec:
    """How readings become samples: windows of ``window`` readings every ``stride``.

    Parameters
    ----------
    streams : tuple of StreamSpec
        The data topics; their channels are concatenated in this order.
    window, stride : int
        Readings per sample and between sample starts: ``N`` readings without a gap make
        ``(N - window) // stride + 1`` samples of shape ``(channels, window)``.
    max_gap : float
        Seconds between consecutive readings beyond which a window is not built across.
    rate : float, optional
        Resample onto this many readings per second (needed with several topics, optional
        with one: without it a single topic's readings are used as they come).
    max_skew : float
        Seconds one topic may run behind another before its readings are given up on.
    label_topic : StreamSpec, optional
        Labels published on a topic of their own (joined to windows by timestamp).
    label_wait : float
        Seconds of stream time a window waits for its label before it is dropped.
    hold : bool
        Report-on-change sensors: hold each channel's last value between its readings, up to
        ``max_gap`` (needs ``rate``), instead of interpolating between them.
    rebirth : bool
        Sparkplug B: ask the edge node for its births (an ``NCMD``) when data comes with
        aliases no birth has named. Off by default: it writes to someone else's equipment.
    """

    streams: tuple[StreamSpec, ...]
    window: int
    stride: int = 0  # 0: the window (no overlap)
    max_gap: float = DEFAULT_MAX_GAP_S
    rate: float | None = None
    max_skew: float = DEFAULT_MAX_SKEW_S
    label_topic: StreamSpec | None = None
    label_wait: float = DEFAULT_LABEL_WAIT_S
    hold: bool = False
    rebirth: bool = False

    def __post_init__(self) -> None:
        if self.stride == 0:
            object.__setattr__(self, "stride", self.window)
        if not self.streams:
            raise ValueError("windowing needs at least one data topic")
        if any(s.channels == 0 for s in self.streams):
            raise ValueError("every data topic needs --fields (its channels)")
        if self.window < 1 or self.stride < 1:
            raise ValueError(f"window and stride must be >= 1, got {self.window}, {self.stride}")
        for name, value in (("max-gap", self.max_gap), ("max-skew", self.max_skew)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if not (math.isfinite(self.label_wait) and self.label_wait >= 0):
            raise ValueError(f"label-wait must be >= 0 seconds, got {self.label_wait}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be > 0 readings per second, got {self.rate}")
        if len(self.streams) > 1 and self.rate is None:
            raise ValueError("several topics are aligned onto one time base: give --rate")
        if self.hold and self.rate is None:
            raise ValueError("--report-on-change holds values on a grid: give --rate")
        if self.rate is not None and self.max_gap < 1 / self.rate:
            raise ValueError(f"max-gap {self.max_gap} s is shorter than one tick at {self.rate}/s")
        topics = [s.key for s in self.streams]
        if self.label_topic is not None:
            topics.append(self.label_topic.topic)
            if self.label_topic.format.label_field is None:
                raise ValueError("a label topic needs --label-field")
        if len(set(topics)) != len(topics):
            raise ValueError(f"a topic is named twice: {topics}")
        kinds = {s.format.payload == "sparkplug" for s in self.streams}
        if kinds == {True}:
            if len({s.topic for s in self.streams}) != 1 or self.label_topic is not None:
                raise ValueError("Sparkplug B streams read one data topic, label-free")
            SparkplugTopic.data(self.streams[0].topic)
        elif self.rebirth:
            raise ValueError("--sparkplug-rebirth goes with --payload sparkplug")
        if len(kinds) > 1:
            raise ValueError("Sparkplug B streams cannot be mixed with JSON or plain ones")
        inline = [s for s in self.streams if s.format.label_field is not None]
        if self.label_topic is not None and inline:
            raise ValueError("labels come from the label topic or from a data topic, not both")
        if len(inline) > 1:
            raise ValueError("labels come from one topic")

    @property
    def channels(self) -> int:
        """Channels of a sample (every topic's, in order)."""
        return sum(s.channels for s in self.streams)

    @property
    def shape(self) -> tuple[int, int]:
        """A sample's shape: ``(channels, window)``, the run config's ``sample-shape``."""
        return (self.channels, self.window)

    @property
    def sparkplug(self) -> SparkplugTopic | None:
        """The Sparkplug B data topic the streams read (None for JSON and plain payloads)."""
        if self.streams[0].format.payload != "sparkplug":
            return None
        return SparkplugTopic.data(self.streams[0].topic)

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The topics to subscribe to: the streams' and the label topic's; with Sparkplug
        B, every message of the data topic's edge node (births, deaths and the sequence
        number come from them all)."""
        if (sparkplug := self.sparkplug) is not None:
            return sparkplug.subscriptions
        labels = () if self.label_topic is None else (self.label_topic.topic,)
        return (*dict.fromkeys(s.topic for s in self.streams), *labels)

    @property
    def labelled(self) -> bool:
        """Whether windows carry labels (from a data topic's field or a label topic)."""
        return self._label_format() is not None

    @property
    def num_classes(self) -> int:
        """Classes the labels index (0 when label-free)."""
        fmt = self._label_format()
        return 0 if fmt is None else fmt.num_classes

    def _label_format(self) -> ReadingFormat | None:
        if self.label_topic is not None:
            return self.label_topic.format
        return next((s.format for s in self.streams if s.format.label_field), None)

    def fingerprint(self) -> str:
        """What a saved windowing state depends on (a restart with another resets it)."""
        return json.dumps(
            {
                "topics": [[s.topic, [f.text for f in s.format.fields]] for s in self.streams],
                "rate": self.rate,
                "window": self.window,
                "labels": None if self.label_topic is None else self.label_topic.topic,
                "labelled": self.labelled,
                **({"hold": True} if self.hold else {}),  # older states were made without
                **({"payload": "sparkplug"} if self.sparkplug else {}),
            }
        )

    @classmethod
    def from_options(
        cls,
        *,
        topics: list[str],
        window: int,
        fields: str | None = None,
        stride: int = 0,
        time_field: str = "ts",
        time_unit: str = "s",
        payload: str = "json",
        time_zone: str | None = None,
        label_field: str | None = None,
        label_topic: str | None = None,
        seq_field: str | None = None,
        classes: str | None = None,
        num_classes: int = 0,
        max_gap: float = DEFAULT_MAX_GAP_S,
        rate: float | None = None,
        max_skew: float = DEFAULT_MAX_SKEW_S,
        label_wait: float = DEFAULT_LABEL_WAIT_S,
        hold: bool = False,
        rebirth: bool = False,
    ) -> WindowSpec:
        """Build it from ``fedstream ingest`` options (see its ``--help``).

        Raises
        ------
        ValueError
            If the options contradict one another or a value is out of range.
        """
        names = tuple(c.strip() for c in classes.split(",")) if classes else ()
        if names and (not all(names) or len(set(names)) != len(names)):
            raise ValueError(f"--classes {classes!r}: names must be distinct and non-empty")
        if label_field is None and (names or label_topic):
            raise ValueError("--classes and --label-topic need --label-field")
        if names and num_classes and num_classes != len(names):
            raise ValueError(f"--num-classes {num_classes} but {len(names)} --classes")
        k = len(names) or num_classes
        if label_field is not None and k < 1:
            raise ValueError("labelled streams need --classes (names) or --num-classes")
        arrival = time_field.strip().lower() == NO_TIME_FIELD
        when = () if arrival else parse_fields(time_field)
        label = parse_fields(label_field)[0] if label_field else None
        seq = parse_fields(seq_field) if seq_field else ()
        one_label = not label_field or len(parse_fields(label_field)) == 1
        if (not arrival and len(when) != 1) or not one_label:
            raise ValueError("--time-field and --label-field name one field each")
        if payload == "plain" and (label_field or seq_field or not arrival):
            raise ValueError(
                "--payload plain is one bare value a message: no --label-field or "
                "--seq-field, and --time-field none (each reading stamped on arrival)"
            )
        if payload == "sparkplug" and (label_field or seq_field or label_topic):
            raise ValueError(
                "--payload sparkplug: metrics carry their own timestamps and the edge node "
                "its sequence number; label-free (no --label-field, --label-topic or "
                "--seq-field)"
            )
        if len(seq) > 1:
            raise ValueError("--seq-field names one field")
        parsed = [parse_topic(t) for t in topics]
        if fields is not None:
            if len(parsed) != 1 or parsed[0][1] is not None:
                raise ValueError("--fields goes with one --topic; give several as TOPIC=FIELDS")
            parsed = [(parsed[0][0], fields)]
        if any(f is None for _, f in parsed):
            raise ValueError("name each topic's channels: --fields, or --topic TOPIC=FIELDS")
        if payload == "plain":
            parsed = [one for t, f in parsed for one in _plain_topics(t, f or "")]
        if payload == "sparkplug":
            parsed = [one for t, f in parsed for one in _sparkplug_metrics(t, f or "")]

        def fmt(channels: str, with_label: bool) -> ReadingFormat:
            return ReadingFormat(
                _channel_paths(channels, payload),
                time_field=None if payload == "sparkplug" else (when[0] if when else None),
                time_unit=time_unit,
                label_field=label if with_label else None,
                classes=names,
                num_classes=k,
                seq_field=seq[0] if seq and channels else None,  # data topics' counter
                payload=payload,
                time_zone=time_zone,
            )

        inline = label is not None and label_topic is None
        streams = tuple(
            StreamSpec(t, fmt(f or "", inline and i == 0)) for i, (t, f) in enumerate(parsed)
        )
        labels = None if label_topic is None else StreamSpec(label_topic, fmt("", True))
        return cls(
            streams,
            window,
            stride,
            max_gap=max_gap,
            rate=rate,
            max_skew=max_skew,
            label_topic=labels,
            label_wait=label_wait,
            hold=hold,
            rebirth=rebirth,
        )


def _channel_paths(channels: str, payload: str) -> tuple[FieldPath, ...]:
    """A topic's channels: JSON field paths; a Sparkplug B metric's name as it is (names
    such as ``Inputs/Temperature`` or ``Motor 1.Speed`` are no paths)."""
    if not channels:
        return ()
    if payload == "sparkplug":
        return (FieldPath(channels, (channels,)),)
    return parse_fields(channels)


def _sparkplug_metrics(topic: str, fields: str) -> list[tuple[str, str]]:
    """A Sparkplug B data topic's channels, one stream per metric name, in ``--fields``'
    order.

    Raises
    ------
    ValueError
        If the topic is no data topic, or a name is empty or repeated.
    """
    SparkplugTopic.data(topic)
    names = [f.strip() for f in fields.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"--fields {fields!r}: metric names must be distinct and non-empty")
    return [(topic, name) for name in names]


def _plain_topics(topic: str, fields: str) -> list[tuple[str, str]]:
    """A plain-payload topic's channels, one topic each: with a ``+`` level, the level that
    names the channel (``esphome/kitchen/sensor/+/state`` and ``temperature,humidity``: one
    topic per name, in that order); without, the topic is its one field's.

    Raises
    ------
    ValueError
        If the topic has ``#`` or more than one ``+``, names several fields without a
        ``+``, or a field is no topic level (``/``, ``+``, ``#``).
    """
    names = [f.strip() for f in fields.split(",")]
    levels = topic.split("/")
    wild = [i for i, level in enumerate(levels) if level == "+"]
    if "#" in levels or len(wild) > 1:
        raise ValueError(
            f"--payload plain: topic {topic!r} may hold one + (the level naming the channel), no #"
        )
    if not wild:
        if len(names) != 1:
            raise ValueError(
                f"--payload plain: topic {topic!r} carries one value: name one field, or put "
                "+ where the channel's name is in the topic"
            )
        return [(topic, names[0])]
    out = []
    for name in names:
        if not name or any(c in name for c in "/+#"):
            raise ValueError(f"--payload plain: {name!r} is not a topic level")
        named = [name if i == wild[0] else level for i, level in enumerate(levels)]
        out.append(("/".join(named), name))
    return out
