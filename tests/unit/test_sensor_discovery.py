"""Sensors found on a broker (``fedstream sensors``): Home Assistant discovery configs,
Sparkplug B births, sampled payloads, and the ingest command lines; against hand cases."""

from __future__ import annotations

import json

import pytest

from deploy.sensor_discovery import (
    Sensor,
    _Seen,
    discover,
    ha_sensor,
    ingest_commands,
    sampled_sensors,
    select,
    sparkplug_sensors,
)
from edge_client.emulation.reading_styles import SparkplugEdge
from edge_client.runtime.windowing import WindowSpec
from edge_client.wire.sparkplug import encode_metrics
from edge_client.wire.sparkplug_b_pb2 import DataType


def config(**keys: object) -> bytes:
    return json.dumps(keys).encode()


def test_a_home_assistant_config_names_its_sensor_with_abbreviations_and_base_topic() -> None:
    # Execute: ESPHome's config (abbreviated keys, ~ as the base topic, availability list)
    esphome = ha_sensor(
        "homeassistant/sensor/kitchen/temperature/config",
        config(**{
            "~": "esphome/kitchen", "stat_t": "~/sensor/temperature/state",
            "unit_of_meas": "°C", "dev_cla": "temperature", "obj_id": "kitchen_temperature",
            "avty": [{"t": "esphome/kitchen/status"}], "dev": {"name": "kitchen"},
        }),
    )  # fmt: skip
    # Zigbee2MQTT's: a field of its JSON state, availability topic in full
    zigbee = ha_sensor(
        "homeassistant/sensor/0x00158d0001/humidity/config",
        config(
            state_topic="zigbee2mqtt/hall",
            value_template="{{ value_json.humidity | float | round(1) }}",
            availability_topic="zigbee2mqtt/bridge/state",
            unique_id="0x00158d0001_humidity_zigbee2mqtt",
        ),
    )
    nested = ha_sensor(
        "homeassistant/sensor/tasmota_1/config",
        config(
            state_topic="tele/t1/SENSOR", value_template="{{ value_json['BME280'].Temperature }}"
        ),
    )
    odd = ha_sensor(
        "homeassistant/sensor/x/config",
        config(state_topic="x/state", value_template="{{ states('sensor.y') }}"),
    )
    # Assert
    assert esphome is not None and zigbee is not None and nested is not None and odd is not None
    assert (esphome.name, esphome.topic, esphome.kind, esphome.unit) == (
        "kitchen_temperature", "esphome/kitchen/sensor/temperature/state", "plain", "°C",
    )  # fmt: skip
    assert esphome.availability == "esphome/kitchen/status" and esphome.device == "kitchen"
    assert (zigbee.kind, zigbee.field, zigbee.name) == ("json", "humidity", "humidity")
    assert zigbee.availability == "zigbee2mqtt/bridge/state"
    assert (nested.kind, nested.field) == ("json", "BME280.Temperature")
    assert odd.note.startswith("value template") and select([odd], []) == []
    # Not a sensor, or a removal (an empty config): nothing
    assert ha_sensor("homeassistant/switch/x/config", config(state_topic="s")) is None
    assert ha_sensor("homeassistant/sensor/x/config", b"") is None


def test_sampled_payloads_show_their_channels() -> None:
    # Execute / Assert: a bare number is one channel named by the topic's last level ...
    assert [(s.name, s.kind) for s in sampled_sensors("esphome/k/sensor/co2/state", b"612")] == [
        ("state", "plain")
    ]
    # ... JSON's numeric fields by path (strings and booleans are no channels) ...
    payload = b'{"temperature": 21.5, "battery": 90, "state": "ON", "ok": true, "a": {"b": 1}}'
    got = sampled_sensors("zigbee2mqtt/hall", payload)
    assert [(s.field, s.kind) for s in got] == [
        ("temperature", "json"), ("battery", "json"), ("a.b", "json"),
    ]  # fmt: skip
    # ... and text that is neither, nothing
    assert sampled_sensors("x", b"hello") == [] and sampled_sensors("x", b"unavailable") == []


def test_sparkplug_births_name_their_numeric_metrics_on_the_data_topic() -> None:
    # Prepare
    births = SparkplugEdge("spBv1.0/plant/DDATA/edge-1/pump-3", ["flow", "rpm"]).messages(
        [1.0], [[1.0, 2.0]]
    )
    text = encode_metrics([("serial", 1, DataType.Int64, 5.0, 0)], 2, 0)
    # Execute
    found = sparkplug_sensors([*births, ("spBv1.0/plant/DBIRTH/edge-1/valve", text)])
    # Assert: the node's bdSeq is no sensor; an Int64 is a number
    assert [(s.name, s.topic, s.note) for s in found] == [
        ("flow", "spBv1.0/plant/DDATA/edge-1/pump-3", ""),
        ("rpm", "spBv1.0/plant/DDATA/edge-1/pump-3", ""),
        ("serial", "spBv1.0/plant/DDATA/edge-1/valve", ""),
    ]


def test_discovery_puts_configs_births_and_samples_together_with_their_rates() -> None:
    # Prepare: what a listener heard over 2 s: a retained config, 4 state messages, a
    # sampled JSON topic with 2 messages, a Sparkplug data topic without its birth
    seen = {
        "homeassistant/sensor/k/t/config": _Seen(0, 0, 1, config(stat_t="k/t/state"), True),
        "k/t/state": _Seen(0, 2, 4, b"21.0"),
        "other/json": _Seen(0, 2, 2, b'{"v": 1}'),
        "spBv1.0/g/DDATA/e/d": _Seen(0, 2, 3, b"\x18\x01"),
    }
    # Execute
    found = discover(seen, [], 2.0)
    # Assert
    assert [(s.name, s.topic, s.source, s.rate) for s in found] == [
        ("t", "k/t/state", "homeassistant", 2.0),
        ("v", "other/json", "sample", 1.0),
        ("?", "spBv1.0/g/DDATA/e/d", "sample", None),
    ]
    assert "no birth" in found[2].note
    assert [s.name for s in discover(seen, [], 2.0, "homeassistant")] == ["t"]


def test_the_ingest_commands_read_each_kind_and_their_options_make_a_window_spec() -> None:
    # Prepare: two bare-value sensors of the same name, two fields of one JSON topic, two
    # Sparkplug metrics
    sensors = [
        Sensor("temp", "a/temp/state", "plain", availability="a/status"),
        Sensor("temp", "b/temp/state", "plain", availability="a/status"),
        Sensor("humidity", "z/hall", "json", field="humidity"),
        Sensor("t", "z/hall", "json", field="BME280.Temperature"),
        Sensor("flow", "spBv1.0/g/DDATA/e/d", "sparkplug", field="flow"),
        Sensor("rpm", "spBv1.0/g/DDATA/e/d", "sparkplug", field="rpm"),
    ]
    # Execute
    commands = ingest_commands(sensors, "mqtt://h:1883", "hall", "hall.sqlite")
    # Assert: one command a kind, each its own device and buffer, one availability option
    argv = {c.sensors[0].kind: c.argv for c in commands}
    assert argv["plain"][:8] == [
        "fedstream", "ingest", "--broker", "mqtt://h:1883", "--device-id", "hall-2",
        "--buffer", "hall-2.sqlite",
    ]  # fmt: skip
    plain = " ".join(argv["plain"])
    assert "--topic a/temp/state=temp --topic b/temp/state=temp_2" in plain
    assert plain.count("--availability-topic a/status") == 1
    assert "--topic z/hall=humidity,BME280.Temperature" in " ".join(argv["json"])
    assert "--fields flow,rpm" in " ".join(argv["sparkplug"])
    for command in commands:  # what the printed options describe is a valid windowing
        options = command.argv
        topics = [options[i + 1] for i, o in enumerate(options) if o == "--topic"]
        payload = options[options.index("--payload") + 1] if "--payload" in options else "json"
        fields = options[options.index("--fields") + 1] if "--fields" in options else None
        spec = WindowSpec.from_options(
            topics=topics, fields=fields, window=60, rate=1.0, payload=payload, hold=True,
            time_field="none" if payload != "sparkplug" else "ts",
        )  # fmt: skip
        assert spec.channels == len(command.sensors)


@pytest.mark.parametrize("pattern", ["kitchen*", "*/temp/*"])
def test_select_matches_name_topic_or_device(pattern: str) -> None:
    sensors = [Sensor("kitchen_t", "a/temp/state", "plain"), Sensor("x", "b/x", "plain")]
    assert [s.name for s in select(sensors, [pattern])] == ["kitchen_t"]
