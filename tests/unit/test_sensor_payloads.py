"""Sensors as they are deployed: one bare value per topic (ESPHome, Home Assistant's
statestream), readings without timestamps (Zigbee2MQTT), local times without a zone
(Tasmota), and values that say the sensor has none; against hand-computed cases."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from edge_client.emulation.reading_styles import default_topic, encode_style, ingest_options
from edge_client.runtime.windowing import WindowAssembler, WindowSpec
from edge_client.wire.frames import REJECT_REASONS, FrameError
from edge_client.wire.readings import (
    MissingValueError,
    ReadingFormat,
    decode_readings,
    encode_readings,
    parse_fields,
)

#: ESPHome's topics: one channel each, named by the level a + stands for.
ESPHOME = "esphome/kitchen/sensor/+/state"
CHANNELS = ("temperature", "humidity", "co2")


def plain(name: str = "temperature") -> ReadingFormat:
    return ReadingFormat(parse_fields(name), time_field=None, payload="plain")


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "value"),
    [(b"21.50", 21.5), (b" -3e2\n", -300.0), (b'"21.5"', 21.5), (b"7", 7.0)],
)
def test_a_plain_payload_is_its_one_value_stamped_on_arrival(payload: bytes, value: float) -> None:
    # Execute
    (reading,) = decode_readings(payload, plain(), arrival=1_700_000_000.25)
    # Assert
    assert reading.values == (value,) and reading.ts == 1_700_000_000.25
    assert reading.label is None and reading.seq is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"abc", "not-a-number"),
        (b"nan", "non-finite"),
        (b"inf", "non-finite"),
        (b"\xff\xfe", "bad-utf8"),
        (b"1" * 65, "too-large"),
        (b"", "empty"),
        (b"1,5", "not-a-number"),
    ],
)
def test_a_bad_plain_payload_is_refused_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(FrameError) as caught:
        decode_readings(payload, plain(), arrival=0.0)
    assert caught.value.reason == reason and reason in REJECT_REASONS


@pytest.mark.parametrize("payload", [b"unavailable", b"unknown", b"None", b" null ", b"n/a"])
def test_a_value_saying_the_sensor_has_none_is_missing_not_refused(payload: bytes) -> None:
    with pytest.raises(MissingValueError):
        decode_readings(payload, plain(), arrival=0.0)


def test_json_without_timestamps_ignores_extra_fields_and_reads_null_as_missing() -> None:
    # Prepare: Zigbee2MQTT's message, no timestamp, fields beyond the channels
    fmt = ReadingFormat(parse_fields("temperature,humidity"), time_field=None)
    message = {"temperature": 21.5, "humidity": 40, "linkquality": 120, "battery": 97}
    # Execute
    (reading,) = decode_readings(json.dumps(message).encode(), fmt, arrival=5.0)
    # Assert: the channels in order, at the arrival; null and "unavailable" are missing:
    # NaN in a reading that has other channels, the whole message when none has a value
    assert reading.values == (21.5, 40.0) and reading.ts == 5.0
    for missing in (None, "unavailable"):
        (partial,) = decode_readings(
            json.dumps({**message, "humidity": missing}).encode(), fmt, 5.0
        )
        assert partial.values[0] == 21.5 and math.isnan(partial.values[1])
        with pytest.raises(MissingValueError):
            none = {**message, "humidity": missing, "temperature": "unknown"}
            decode_readings(json.dumps(none).encode(), fmt, 5.0)
    with pytest.raises(FrameError, match="NaN") as err:  # NaN in the message itself
        decode_readings(b'{"temperature": NaN, "humidity": 1}', fmt, 5.0)
    assert err.value.reason == "non-finite"


def test_an_unavailable_channel_is_held_for_a_report_on_change_sensor_else_counted() -> None:
    # Prepare: Zigbee2MQTT's readings of two channels, the second message's humidity
    # unavailable; on a 1 Hz grid, holding (report on change) and not
    messages = [
        (
            "z/hall",
            json.dumps({"t": 20.0 + i, "h": "unavailable" if i == 1 else 40.0 + i}).encode(),
            float(i),
        )
        for i in range(4)
    ]
    held, dropped = (
        WindowSpec.from_options(topics=["z/hall=t,h"], window=3, rate=1.0, time_field="none",
                                max_gap=5.0, hold=hold)
        for hold in (True, False)
    )  # fmt: skip
    # Execute
    got = WindowAssembler(held).feed(messages)
    other = WindowAssembler(dropped).feed(messages)
    # Assert: held, humidity keeps 40 at tick 1 and temperature is taken; not held, the
    # reading is counted unavailable and the grid interpolates across it
    np.testing.assert_allclose(got.x[0], [[20, 21, 22], [40, 40, 42]])
    assert got.counts["readings"] == 4 and got.counts["readings-unavailable"] == 0
    assert other.counts["readings"] == 3 and other.counts["readings-unavailable"] == 1
    np.testing.assert_allclose(other.x[0], [[20, 21, 22], [40, 41, 42]])


def test_a_local_time_without_a_zone_is_read_in_the_given_zone() -> None:
    # Prepare: Tasmota's "Time", local to Berlin (UTC+1 in December, UTC+2 in July)
    fmt = ReadingFormat(parse_fields("t"), time_field=parse_fields("Time")[0])
    berlin = ReadingFormat(fmt.fields, time_field=fmt.time_field, time_zone="Europe/Berlin")

    # Execute
    def stamp(text: str, f: ReadingFormat) -> float:
        (reading,) = decode_readings(json.dumps({"Time": text, "t": 1}).encode(), f)
        return reading.ts

    # Assert: as UTC without a zone (as before), shifted by the zone's offset with one
    winter = datetime(2026, 12, 5, 4, 55, tzinfo=UTC).timestamp()
    summer = datetime(2026, 7, 5, 4, 55, tzinfo=UTC).timestamp()
    assert stamp("2026-12-05T04:55:00", fmt) == winter
    assert stamp("2026-12-05T04:55:00", berlin) == winter - 3600
    assert stamp("2026-07-05T04:55:00", berlin) == summer - 7200
    assert stamp("2026-12-05T04:55:00+00:00", berlin) == winter  # a zone of its own wins
    with pytest.raises(ValueError, match="IANA name"):
        ReadingFormat(fmt.fields, time_zone="Mars/Olympus")


# -- the spec the options make -------------------------------------------------------------


def esphome(**kw: Any) -> WindowSpec:
    options: dict[str, Any] = {
        "topics": [ESPHOME],
        "fields": ",".join(CHANNELS),
        "window": 4,
        "payload": "plain",
        "time_field": "none",
        "rate": 1.0,
        "max_gap": 30.0,
    }
    return WindowSpec.from_options(**(options | kw))


def test_a_plus_level_names_each_channel_in_the_order_of_the_fields() -> None:
    # Execute
    spec = esphome()
    # Assert: one topic per channel, in --fields' order, each one bare value
    assert [s.topic for s in spec.streams] == [
        f"esphome/kitchen/sensor/{name}/state" for name in CHANNELS
    ]
    assert [s.format.fields[0].text for s in spec.streams] == list(CHANNELS)
    assert all(s.format.payload == "plain" and s.format.time_field is None for s in spec.streams)
    assert spec.shape == (3, 4)


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"topics": ["a/#"]}, "one +"),
        ({"topics": ["a/+/+"]}, "one +"),
        ({"topics": ["a/b"]}, "name one field"),
        ({"time_field": "ts"}, "--time-field none"),
        ({"label_field": "act", "num_classes": 2}, "no --label-field"),
        ({"fields": "temp/x"}, "not a topic level"),
        ({"rate": None}, "give --rate"),
    ],
)
def test_plain_options_that_cannot_hold_are_refused(kw: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        esphome(**kw)


# -- windows -------------------------------------------------------------------------------


def recording(n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """``n`` readings of the three channels, one a second from t0."""
    t = 1_700_000_000.0 + np.arange(n, dtype=np.float64)
    values = np.stack([20 + np.sin(t / 7), 40 + np.cos(t / 5), 400 + t % 13], axis=1)
    return t, values


def test_bare_values_per_topic_make_the_windows_per_reading_json_makes() -> None:
    # Prepare: one recording as today's per-reading JSON (three topics, timestamps) and as
    # ESPHome's bare values, each arriving at its reading's time (the channels 0.1 s apart)
    t, values = recording()
    json_spec = WindowSpec.from_options(
        topics=[f"s/{name}={name}" for name in CHANNELS], window=4, rate=1.0, max_gap=30.0
    )
    as_json = [
        (f"s/{name}", json.dumps({"ts": float(ts), name: float(v[c])}).encode(), float(ts))
        for ts, v in zip(t, values, strict=True)
        for c, name in enumerate(CHANNELS)
    ]
    as_plain = [
        (f"esphome/kitchen/sensor/{name}/state", repr(float(v[c])).encode(), float(ts))
        for ts, v in zip(t, values, strict=True)
        for c, name in enumerate(CHANNELS)
    ]
    # Execute
    want = WindowAssembler(json_spec).feed(as_json)
    got = WindowAssembler(esphome()).feed(as_plain)
    # Assert: the same windows, channel order and values (the stamps are the same times)
    assert len(want.y) > 0 and got.x.shape == want.x.shape
    np.testing.assert_allclose(got.x, want.x, rtol=1e-6)
    np.testing.assert_allclose(got.ts, want.ts)
    assert not got.rejected and got.counts["readings"] == 3 * len(t)


def test_a_burst_stamped_on_arrival_is_neither_duplicate_nor_late() -> None:
    # Prepare: 10 readings of one topic that all arrived at the same instant, then one
    # from a clock stepped back
    spec = esphome(fields="temperature", topics=["esphome/kitchen/sensor/temperature/state"])
    topic = spec.streams[0].topic
    burst = [(topic, f"{20 + i}".encode(), 100.0) for i in range(10)] + [(topic, b"31", 99.0)]
    # Execute
    made = WindowAssembler(spec).feed(burst)
    # Assert: every reading taken, in order, none refused
    assert made.counts["readings"] == 11 and not made.rejected
    assert made.counts["duplicates"] == 0


def test_unavailable_values_are_counted_apart_from_refusals() -> None:
    # Prepare
    spec = esphome(fields="temperature", topics=["esphome/kitchen/sensor/temperature/state"])
    topic = spec.streams[0].topic
    messages = [(topic, b"21.5", 1.0), (topic, b"unavailable", 2.0), (topic, b"oops", 3.0)]
    # Execute
    made = WindowAssembler(spec).feed(messages)
    # Assert
    assert made.counts["readings"] == 1 and made.counts["readings-unavailable"] == 1
    assert made.rejected == {"not-a-number": 1}
    assert json.loads(made.state)["stamped-on-arrival"] == [topic]


# -- replays in each convention (fedstream publish --style) --------------------------------


def spec_of(options: list[str], **windowing: Any) -> WindowSpec:
    """The WindowSpec ``fedstream ingest`` makes of these options (as its CLI maps them)."""
    names = {"--payload": "payload", "--time-field": "time_field", "--fields": "fields"}
    names |= {"--time-zone": "time_zone"}
    pairs = dict(zip(options[::2], options[1::2], strict=True))
    kw: dict[str, Any] = {names[k]: v for k, v in pairs.items() if k in names}
    return WindowSpec.from_options(topics=[pairs["--topic"]], **kw, **windowing)


@pytest.mark.parametrize(
    ("style", "zone"),
    [("esphome", None), ("zigbee2mqtt", None), ("tasmota", "Europe/Berlin"), ("tasmota", None)],
)
def test_a_recording_replayed_in_a_convention_makes_the_windows_of_per_reading_json(
    style: str, zone: str | None
) -> None:
    # Prepare: the recording as fedstream's JSON, and as the convention's messages read back
    # with the ingest options the publisher prints; each message arrives at its reading's
    # time (a spread of arrivals moves the grid's first tick: the broker test has that)
    t, values = recording()
    rows, names = values.tolist(), list(CHANNELS)
    reference = WindowAssembler(WindowSpec.from_options(
        topics=["s/all"], fields=",".join(names), window=4, rate=1.0, max_gap=30.0
    )).feed([("s/all", encode_readings([float(ts)], [row], names), float(ts))
             for ts, row in zip(t, rows, strict=True)])  # fmt: skip
    topic = default_topic(style, "kitchen")
    assert topic is not None
    messages = []
    for ts, row in zip(t, rows, strict=True):
        sent = encode_style(style, topic, [float(ts)], [row], names, zone)
        messages += [(where, body, float(ts)) for where, body in sent]
    spec = spec_of(ingest_options(style, topic, names, zone), window=4, rate=1.0, max_gap=30.0)
    # Execute
    made = WindowAssembler(spec).feed(messages)
    # Assert: the same windows, in the same channel order, with the same values
    assert not made.rejected and made.x.shape == reference.x.shape and len(made.y) > 0
    np.testing.assert_allclose(made.x, reference.x, rtol=1e-6)
    np.testing.assert_allclose(made.ts, reference.ts)


def test_an_unknown_style_or_an_esphome_topic_without_a_plus_is_refused() -> None:
    with pytest.raises(ValueError, match="one of json, esphome"):
        encode_style("homie", "t", [0.0], [[1.0]], ["x"])
    with pytest.raises(ValueError, match="needs a \\+"):
        encode_style("esphome", "esphome/kitchen/state", [0.0], [[1.0]], ["x"])


# -- report-on-change: values held between reports -----------------------------------------


def test_a_report_on_change_channel_is_held_between_its_reports_up_to_max_gap() -> None:
    # Prepare: two channels on a 1/s grid, temperature reports at t = 0 and 5 only (it did
    # not change), humidity every second; max-gap 10 s
    spec = WindowSpec.from_options(
        topics=["h/temperature=v", "h/humidity=v"], window=3, rate=1.0, max_gap=10.0,
        time_field="none", hold=True,
    )  # fmt: skip
    reports = [("h/temperature", {"v": 20.0}, 0.0), ("h/temperature", {"v": 21.0}, 5.0)]
    reports += [("h/humidity", {"v": 40.0 + t}, float(t)) for t in range(10)]
    messages = sorted(
        ((topic, json.dumps(body).encode(), at) for topic, body, at in reports),
        key=lambda m: m[2],
    )
    # Execute
    made = WindowAssembler(spec).feed(messages)
    # Assert: ticks 0-8 (a tick waits for a reading past it: 9's), temperature held (20
    # until 5, then 21), humidity as sent; windows of 3 ticks: [0-2], [3-5], [6-8]; nothing
    # counted missing though temperature was silent
    assert made.x.shape == (3, 2, 3)
    np.testing.assert_allclose(made.x[:, 0].ravel(), [20, 20, 20, 20, 20, 21, 21, 21, 21])
    np.testing.assert_allclose(made.x[:, 1].ravel(), [40 + t for t in range(9)])
    assert made.counts["readings-missing"] == 0


def test_a_held_value_expires_at_max_gap_and_a_channel_never_heard_holds_windows_back() -> None:
    # Prepare: max-gap 3 s; temperature reports at 0 only, humidity every second to 8
    spec = WindowSpec.from_options(
        topics=["h/temperature=v", "h/humidity=v"], window=2, rate=1.0, max_gap=3.0,
        time_field="none", hold=True,
    )  # fmt: skip
    humidity = [("h/humidity", json.dumps({"v": float(t)}).encode(), float(t)) for t in range(10)]
    # Execute: before temperature's first report, and after it
    waiting = WindowAssembler(spec)
    before = waiting.feed(humidity)
    held = WindowAssembler(spec)
    after = held.feed([("h/temperature", b'{"v": 20.0}', 0.0), *humidity])
    # Assert: nothing while a channel has never reported (and the state says which); then
    # ticks 0-3 only (temperature's value expires 3 s after its report), two windows
    assert len(before.y) == 0
    assert json.loads(before.state)["never-reported"] == ["h/temperature"]
    assert after.x.shape == (2, 2, 2) and json.loads(after.state)["never-reported"] == []
    np.testing.assert_allclose(after.x[:, 1].ravel(), [0.0, 1.0, 2.0, 3.0])


def test_report_on_change_needs_a_rate() -> None:
    with pytest.raises(ValueError, match="give --rate"):
        WindowSpec.from_options(topics=["h/t=v"], window=2, hold=True)
