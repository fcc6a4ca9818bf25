"""Devices' statuses as Prometheus metrics (edge_client.runtime.status_metrics), and the fleet's
rows (deploy.fleet_status): what a status says, and nothing made up where it says something else."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from deploy.fleet_status import fleet_rows
from deploy.probes import MetricSamples, parse_metrics
from edge_client.runtime.status_metrics import StatusCollector

STATUS: dict[str, Any] = {
    "device-id": "pi-1", "online": True, "ts": 1000.0, "rate": 12.5, "fill": 30,
    "capacity": 100, "fill-fraction": 0.3, "accepted": 40, "dropped": 2, "consumed": 10,
    "rejected": 3, "rejected-by-reason": {"bad-shape": 2, "nan": 1},
    "drift": {"changes": 1, "seen": 500, "last-change": 400, "error": 0.2},
    "messages-missing": 7, "readings-missing": 120, "mqtt-version": "5",
}  # fmt: skip
HOSTILE: dict[str, Any] = {
    "online": "yes", "ts": "yesterday", "rate": "fast", "fill": True,
    "rejected-by-reason": ["bad"], "drift": "x",
}  # fmt: skip


def exported(statuses: dict[str, dict[str, Any]]) -> MetricSamples:
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: statuses))
    return parse_metrics(generate_latest(registry).decode())


def test_a_status_becomes_its_metrics() -> None:
    # Execute
    m = exported({"pi-1": STATUS})
    # Assert
    pi = (("device", "pi-1"),)
    assert m[("fedstream_device_online", pi)] == 1
    assert m[("fedstream_device_stream_rate", pi)] == 12.5
    assert m[("fedstream_device_buffer_fill_ratio", pi)] == 0.3
    assert m[("fedstream_device_samples_accepted_total", pi)] == 40
    assert m[("fedstream_device_samples_refused_total", (*pi, ("reason", "nan")))] == 1
    assert m[("fedstream_device_drift_changes_total", pi)] == 1
    assert m[("fedstream_device_last_seen_timestamp_seconds", pi)] == 1000
    assert m[("fedstream_device_messages_missing", pi)] == 7
    assert m[("fedstream_device_readings_missing_total", pi)] == 120


def test_a_hostile_status_exports_only_what_is_well_typed() -> None:
    # Execute: values of the wrong type, from the network.
    m = exported({"x": HOSTILE})
    # Assert: online and error (derived flags) only; nothing else made up, no error.
    assert {name for name, _ in m} == {"fedstream_device_online", "fedstream_device_error"}
    assert m[("fedstream_device_online", (("device", "x"),))] == 0  # "yes" is not true


def test_fleet_rows_read_a_status_and_a_hostile_one() -> None:
    # Execute
    rows = {r["device"]: r for r in fleet_rows({"pi-1": STATUS, "x": HOSTILE}, now=1010.0)}
    # Assert
    pi = rows["pi-1"]
    assert (pi["online"], pi["last-seen-s"], pi["refused"], pi["drift"]) == (
        True, 10.0, 3, 1,
    )  # fmt: skip
    assert pi["refused-by-reason"] == {"bad-shape": 2, "nan": 1}
    assert (pi["messages-missing"], pi["readings-missing"], pi["mqtt-version"]) == (7, 120, "5")
    x = rows["x"]
    assert (x["online"], x["rate"], x["fill"], x["last-seen-s"]) == (False, None, None, None)
    assert x["refused-by-reason"] == {} and x["drift"] is None
    assert x["messages-missing"] is None and x["mqtt-version"] is None


def test_fleet_rows_name_the_sensors_away_and_a_sparkplug_death() -> None:
    # Prepare: one device follows two availability topics, one following a Sparkplug B
    # edge node that died, one follows none; a hostile value of the key
    statuses: dict[str, dict[str, Any]] = {
        "hall": {
            **STATUS,
            "availability": {"zigbee2mqtt/a/availability": "online", "esphome/b/status": "offline"},
            "sensors-offline": ["esphome/b/status"],
        },
        "pump": {**STATUS, "sparkplug": {"edge-node": "plant/edge-1", "device": "pump-3",
                                          "node-online": False, "online": False}},
        "pi-1": STATUS,
        "x": {**HOSTILE, "sensors-offline": "all"},
    }  # fmt: skip
    # Execute
    rows = {r["device"]: r for r in fleet_rows(statuses, now=1010.0)}
    # Assert
    assert rows["hall"]["sensors-offline"] == ["esphome/b/status"]
    assert rows["pump"]["sensors-offline"] == ["sparkplug plant/edge-1/pump-3"]
    assert rows["pi-1"]["sensors-offline"] is None and rows["x"]["sensors-offline"] is None


def test_availability_messages_read_as_one_word() -> None:
    # Execute / Assert: ESPHome / Home Assistant, Tasmota's LWT, Zigbee2MQTT's JSON
    from edge_client.wire.readings import availability_state

    assert availability_state(b"online") == "online"
    assert availability_state(b"Offline\n") == "offline"
    assert availability_state(b'{"state": "online"}') == "online"
    assert availability_state(b'{"state": 3}') == '{"state": 3}'
    assert availability_state(b"\xff" * 1000) == "\ufffd" * 64
