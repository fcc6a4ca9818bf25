"""Sensors as they are deployed, through a real broker: ESPHome's bare values, one channel a
topic and no timestamp, published by ``mosquitto_pub`` and a plain paho client, into
``fedstream ingest --payload plain --time-field none``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from deploy.brokers import MosquittoBroker
from deploy.local import ProcessGroup, wait_until
from deploy.probes import buffer_stats as stats
from deploy.probes import publish_report, start_ingest, start_publisher
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import INGEST_SUBSCRIBED_LOG

pytestmark = [
    pytest.mark.mosquitto,
    pytest.mark.skipif(
        shutil.which("mosquitto_pub") is None,
        reason="mosquitto_pub not installed (apt-get install -y mosquitto-clients)",
    ),
]

CHANNELS = ("temperature", "humidity", "co2")
TOPIC = "esphome/kitchen/sensor/{}/state"


@pytest.fixture
def stock() -> Iterator[MosquittoBroker]:
    """Mosquitto as installed, with nothing but a listener."""
    with MosquittoBroker.stock() as broker:
        yield broker


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.timeout(120)
def test_esphome_bare_values_are_windowed_on_arrival_and_old_retained_ones_skipped(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    broker = stock
    # Prepare: the broker holds each channel's last value, retained, from before the daemon
    # (ESPHome retains its states); then the daemon subscribes with a + for the channel
    for name in CHANNELS:
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port_of(broker.url)), "-r",
             "-t", TOPIC.format(name), "-m", "99.0"],
            check=True, timeout=30,
        )  # fmt: skip
    buf = tmp_path / "kitchen.sqlite"
    options = (
        "--payload", "plain", "--time-field", "none", "--topic", TOPIC.format("+"),
        "--fields", ",".join(CHANNELS), "--window", "5", "--rate", "10", "--max-gap", "2",
    )  # fmt: skip
    start_ingest(procs, broker.url, buf, "kitchen", *options, connected=True)
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port_of(broker.url))
    client.loop_start()
    n = 60
    try:
        # Execute: 60 readings of each channel at 20 a second, as a sensor sends them, with
        # a value the sensor says it does not have and one that is no number
        for i in range(n):
            for c, name in enumerate(CHANNELS):
                client.publish(TOPIC.format(name), f"{100 * c + i:.2f}", qos=1).wait_for_publish(5)
            time.sleep(0.05)
        client.publish(TOPIC.format("co2"), "unavailable", qos=1).wait_for_publish(5)
        client.publish(TOPIC.format("co2"), "lots", qos=1).wait_for_publish(5)
        assert wait_until(lambda: stats(buf).get("readings", 0) >= 3 * n, 30), stats(buf)
        assert wait_until(lambda: stats(buf).get("rejected", 0) >= 1, 10), stats(buf)
    finally:
        client.loop_stop()
        client.disconnect()
    final = stats(buf)
    with BufferStore(buf) as store:
        windows = store.sample(store.fill, np.random.default_rng(0))
    # Assert: every fresh reading taken (none a duplicate or late, though stamped on
    # arrival), the 3 retained ones skipped, the unavailable one counted apart, the bad one
    # refused by reason, and the daemon still taking readings
    assert final["readings"] == 3 * n and final["duplicates"] == 0, json.dumps(final)
    assert final["retained-skipped"] == 3 and final["readings-unavailable"] == 1
    assert final["rejected-by-reason"] == {"not-a-number": 1}
    assert final["stamped-on-arrival"] == [TOPIC.format(name) for name in CHANNELS]
    # windows of (3 channels, 5 ticks) in --fields' order: each channel near its own level
    # (the retained 99 never in them), rising over time
    assert len(windows.y) >= 3 and windows.x.shape[1:] == (3, 5)
    for c in range(3):
        assert np.all((windows.x[:, c] >= 100 * c) & (windows.x[:, c] < 100 * c + n))


@pytest.mark.timeout(150)
def test_readings_stamped_on_arrival_lose_nothing_across_kill9_and_repeat_at_most_a_transaction(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: one channel of bare values, each message its own index, QoS 1
    topic = TOPIC.format("temperature")
    buf = tmp_path / "kitchen.sqlite"
    options = (
        "--payload", "plain", "--time-field", "none", "--topic", topic,
        "--fields", "temperature", "--window", "10", "--max-gap", "5",
    )  # fmt: skip
    start_ingest(procs, stock.url, buf, "kitchen", *options, connected=True)
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port_of(stock.url))
    client.loop_start()
    n, killed_at = 1500, 0
    try:
        # Execute: about 500 messages a second; kill -9 the daemon twice mid-stream (the
        # broker keeps its session and the messages meanwhile), start it again each time
        for i in range(n):
            client.publish(topic, str(i), qos=1)
            if i % 50 == 49:
                time.sleep(0.1)
            if i in (400, 900):
                killed_at += 1
                procs.kill("ingest")
                start_ingest(procs, stock.url, buf, "kitchen", *options)
        assert wait_until(lambda: stats(buf).get("readings", 0) >= n, 60), stats(buf)
        time.sleep(1.0)  # redeliveries have time to show up
    finally:
        client.loop_stop()
        client.disconnect()
    final = stats(buf)
    repeated = final["readings"] - n
    print(f"stamped on arrival: {repeated} of {n} readings taken twice over {killed_at} kill -9")
    # Assert: nothing lost; what is taken twice is at most the one committed transaction
    # per kill whose acknowledgements had not reached the broker (a windowed transaction
    # holds at most RECENT_TIMESTAMPS = 64 messages)
    assert 0 <= repeated <= 64 * killed_at, json.dumps(final)
    assert final["rejected"] == 0 and final["duplicates"] == 0


def kitchen_recording(path: Path, n: int) -> np.ndarray:
    """``n`` readings of three rising channels (each reading's values tell its index), as
    the CSV ``fedstream publish --readings --source`` replays."""
    i = np.arange(n, dtype=np.float64)
    rows = np.stack([20 + i / 100, 40 + i / 10, 400 + i], axis=1)
    lines = ["temperature,humidity,co2"] + [",".join(f"{v:.2f}" for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return rows


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("style", "extra"),
    [("json", []), ("zigbee2mqtt", []), ("tasmota", ["--time-zone", "Europe/Berlin"])],
)
def test_a_recording_published_in_a_convention_is_read_back_window_for_window(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path, style: str, extra: list[str]
) -> None:
    # Prepare: 300 readings, read back with the ingest options `fedstream publish --style`
    # prints (windows of 20, no resampling: one topic)
    from edge_client.emulation.reading_styles import default_topic, ingest_options

    n, w = 300, 20
    rows = kitchen_recording(tmp_path / "kitchen.csv", n)
    topic = default_topic(style, "kitchen") or "fedstream/v1/kitchen/samples"
    zone = extra[1] if extra else None
    buf = tmp_path / "kitchen.sqlite"
    options = ingest_options(style, topic, list(CHANNELS), zone)
    start_ingest(procs, stock.url, buf, "kitchen", *options, "--window", str(w), connected=True)
    # Execute: the publisher, as a device of that kind would send it
    pub = start_publisher(
        procs, stock.url, "kitchen", "--readings", "--source", str(tmp_path / "kitchen.csv"),
        "--rate", "200", "--count", str(n), "--style", style, *extra,
    )  # fmt: skip
    report = publish_report(pub)
    assert wait_until(lambda: stats(buf).get("readings", 0) >= n, 30), stats(buf)
    with BufferStore(buf) as store:
        got = store.sample(store.fill, np.random.default_rng(0))
    order = np.argsort(got.ts)
    # Assert: every reading, and window for window the recording's rows in --fields' order
    assert report["samples"] == n and stats(buf)["rejected"] == 0
    assert len(order) == n // w
    want = rows.reshape(n // w, w, 3).transpose(0, 2, 1)
    np.testing.assert_allclose(got.x[order], want, rtol=1e-6)


@pytest.mark.timeout(240)
def test_a_recording_published_as_esphome_values_is_resampled_in_channel_order(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: three channels, a topic each, read back on a grid at the publishing rate
    from edge_client.emulation.reading_styles import default_topic, ingest_options

    n, w = 300, 20
    kitchen_recording(tmp_path / "kitchen.csv", n)
    topic = default_topic("esphome", "kitchen")
    assert topic is not None
    buf = tmp_path / "kitchen.sqlite"
    options = ingest_options("esphome", topic, list(CHANNELS))
    start_ingest(procs, stock.url, buf, "kitchen", *options, "--window", str(w),
                 "--rate", "100", "--max-gap", "1", connected=True)  # fmt: skip
    # Execute
    pub = start_publisher(
        procs, stock.url, "kitchen", "--readings", "--source", str(tmp_path / "kitchen.csv"),
        "--rate", "100", "--count", str(n), "--style", "esphome",
    )  # fmt: skip
    report = publish_report(pub)
    assert wait_until(lambda: stats(buf).get("readings", 0) >= 3 * n, 30), stats(buf)
    time.sleep(0.5)
    with BufferStore(buf) as store:
        got = store.sample(store.fill, np.random.default_rng(0))
    # Assert: every channel's every value taken; windows in --fields' order, each channel
    # between its own first and last value and rising (the grid interpolates between the
    # arrival-stamped readings of a rising recording)
    final = stats(buf)
    assert report["messages"] == 3 * n and final["rejected"] == 0, json.dumps(final)
    assert len(got.y) >= 10, json.dumps(final)
    low, high = (20.0, 40.0, 400.0), (20 + n / 100, 40 + n / 10, 400.0 + n)
    for c in range(3):
        assert np.all((got.x[:, c] >= low[c] - 1e-6) & (got.x[:, c] <= high[c] + 1e-6))
        assert np.all(np.diff(got.x[:, c], axis=1) >= -1e-6)


@pytest.mark.timeout(240)
def test_a_recording_published_as_sparkplug_b_comes_back_as_its_rows(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: an edge node's births, then a DDATA a reading (each metric with the reading's
    # time), read back with the options `fedstream publish --style sparkplug` prints, on a
    # grid at the publishing rate (three metrics: three streams to align)
    from edge_client.emulation.reading_styles import default_topic, ingest_options

    n, w = 300, 20
    rows = kitchen_recording(tmp_path / "kitchen.csv", n)
    topic = default_topic("sparkplug", "kitchen")
    assert topic is not None
    buf = tmp_path / "kitchen.sqlite"
    options = ingest_options("sparkplug", topic, list(CHANNELS))
    start_ingest(procs, stock.url, buf, "kitchen", *options, "--window", str(w),
                 "--rate", "100", connected=True)  # fmt: skip
    # Execute
    pub = start_publisher(
        procs, stock.url, "kitchen", "--readings", "--source", str(tmp_path / "kitchen.csv"),
        "--rate", "100", "--count", str(n), "--style", "sparkplug",
    )  # fmt: skip
    report = publish_report(pub)
    assert wait_until(lambda: stats(buf).get("readings", 0) >= 3 * n, 30), stats(buf)
    with BufferStore(buf) as store:
        got = store.sample(store.fill, np.random.default_rng(0))
    order = np.argsort(got.ts)
    # Assert: NBIRTH, DBIRTH (the first reading) and a DDATA for each other; nothing lost or
    # refused; window for window the recording's rows in --fields' order, within what the
    # resampling moves a value (the grid's ticks fall between the readings' own times: at
    # most one reading's step of the channel)
    final = stats(buf)
    assert report["messages"] == n + 1 and final["rejected"] == 0, json.dumps(final)
    assert final["sparkplug-lost"] == 0 and final["sparkplug"]["online"] is True
    assert final["sparkplug"]["births"] == 1 and final["sparkplug"]["held"] == 0
    # The grid's ticks between the first reading and the last: 299 of them (14 windows), or
    # 300 (15) when the first reading falls on the 10 ms grid, which Sparkplug's whole
    # milliseconds make happen about one run in ten (the last reading is then a tick itself;
    # 2 of 18 runs here)
    assert len(order) in (n // w - 1, n // w)
    want = rows.reshape(n // w, w, 3).transpose(0, 2, 1)[: len(order)]
    step = np.abs(np.diff(rows, axis=0)).max(axis=0)  # per channel
    assert np.all(np.abs(got.x[order] - want) <= step[None, :, None] + 1e-4)


@pytest.mark.timeout(240)
def test_sparkplug_b_losses_deaths_and_hostile_messages_through_a_broker(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: the daemon on one device's data topic; an edge node that publishes 10,000
    # DDATA after its births, 100 of them dropped on purpose (none next to another), then
    # hostile messages, then its device's and its own death
    import random

    from edge_client.emulation.reading_styles import SparkplugEdge
    from edge_client.wire.sparkplug import encode_metrics
    from edge_client.wire.sparkplug_b_pb2 import DataType, Payload

    data_topic = "spBv1.0/plant/DDATA/edge-1/pump-3"
    buf = tmp_path / "pump.sqlite"
    start_ingest(procs, stock.url, buf, "pump", "--payload", "sparkplug", "--topic", data_topic,
                 "--fields", "flow", "--window", "50", connected=True)  # fmt: skip
    edge = SparkplugEdge(data_topic, ["flow"])
    t0 = time.time() - 200
    messages = edge.messages([t0 + i / 50 for i in range(10_001)], [[i] for i in range(10_001)])
    dropped = set(random.Random(5).sample(range(2, len(messages), 2), 100))
    huge = Payload()  # no sequence number: refused, it costs the count nothing
    for i in range(100_000):
        huge.metrics.add(name=f"m{i}", alias=i, datatype=DataType.Double, double_value=1.0)
    hostile = [
        (data_topic, b'{"flow": 1}'),
        ("spBv1.0/plant/DBIRTH/edge-1/pump-3", huge.SerializeToString()),
        ("spBv1.0/plant/DDATA/edge-1/" + "x" * 64_000, b"\x18\x01"),
    ]
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port_of(stock.url))
    client.loop_start()
    try:
        # Execute
        for k, (topic, payload) in enumerate(messages):
            if k not in dropped:
                client.publish(topic, payload, qos=1)
        for topic, payload in hostile:
            client.publish(topic, payload, qos=1)
        for topic, payload in (
            ("spBv1.0/plant/DDEATH/edge-1/pump-3", encode_metrics([], edge._next(), 0)),
            ("spBv1.0/plant/NDEATH/edge-1", encode_metrics([], None, 0)),
        ):
            client.publish(topic, payload, qos=1).wait_for_publish(10)
        done = lambda: stats(buf).get("sparkplug", {}).get("node-online") is False  # noqa: E731
        assert wait_until(done, 60), stats(buf)
    finally:
        client.loop_stop()
        client.disconnect()
    final = stats(buf)
    # Assert: exactly the dropped messages lost; each hostile one refused by its reason,
    # the daemon alive and every other reading taken; the deaths shown
    assert final["sparkplug-lost"] == 100, json.dumps(final)
    assert final["readings"] == 10_001 - 100
    assert final["rejected-by-reason"] == {
        "bad-protobuf": 1,
        "too-many-metrics": 1,
        "bad-topic": 1,
    }, json.dumps(final)
    assert final["sparkplug"]["online"] is False and final["sparkplug"]["deaths"] == 2
    assert final["accepted"] == (10_001 - 100) // 50  # windows of 50 readings


@pytest.mark.timeout(240)
def test_fedstream_sensors_finds_fifty_home_assistant_sensors_and_its_commands_ingest_them(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: a Home Assistant discovery set of 50 retained configs: 35 ESPHome sensors
    # (one bare value a topic, 7 devices with an availability topic each) and 15 fields of 5
    # Zigbee2MQTT devices' JSON
    from deploy.local import fedstream_command

    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port_of(stock.url))
    client.loop_start()
    plain = [(f"node{d}", f"s{k}") for d in range(7) for k in range(5)]
    zigbee = [(f"z{d}", f) for d in range(5) for f in ("temperature", "humidity", "pressure")]
    try:
        for node, name in plain:
            cfg = {"~": f"esphome/{node}", "stat_t": f"~/sensor/{name}/state",
                   "obj_id": f"{node}_{name}", "avty_t": f"esphome/{node}/status"}  # fmt: skip
            client.publish(f"homeassistant/sensor/{node}/{name}/config", json.dumps(cfg),
                           qos=1, retain=True).wait_for_publish(5)  # fmt: skip
        for dev, name in zigbee:
            cfg = {"state_topic": f"zigbee2mqtt/{dev}", "object_id": f"{dev}_{name}",
                   "value_template": f"{{{{ value_json.{name} }}}}"}  # fmt: skip
            client.publish(f"homeassistant/sensor/{dev}/{name}/config", json.dumps(cfg),
                           qos=1, retain=True).wait_for_publish(5)  # fmt: skip
        # Execute: discovery as a user runs it, and every command it prints, as printed
        out = subprocess.run(
            fedstream_command("sensors", "--broker", stock.url, "--discovery", "homeassistant",
                              "--seconds", "1.5", "--device-id", "home", "--buffer",
                              str(tmp_path / "home.sqlite"), "--json"),
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        found = json.loads(out.stdout)
        for n, argv in enumerate(found["commands"]):
            assert argv[:2] == ["fedstream", "ingest"]
            start_ingest_argv(procs, f"ingest-{n}", argv[2:], tmp_path)
        buffers = [Path(a[a.index("--buffer") + 1]) for a in found["commands"]]
        for _ in range(3):  # three reports of every sensor
            for node, name in plain:
                client.publish(f"esphome/{node}/sensor/{name}/state", "21.5", qos=1)
            for d in range(5):
                values = {"temperature": 20.0, "humidity": 40.0, "pressure": 1000.0}
                client.publish(f"zigbee2mqtt/z{d}", json.dumps({**values, "linkquality": 90}),
                               qos=1)  # fmt: skip
            time.sleep(1.1)
        for d in range(7):
            client.publish(f"esphome/node{d}/status", "offline" if d == 3 else "online",
                           qos=1, retain=True)  # fmt: skip
        want = {"plain": 3 * 35, "json": 3 * 5}  # a JSON message is one reading of 3 channels
        done = lambda: sum(stats(b).get("readings", 0) for b in buffers) >= sum(want.values())  # noqa: E731
        assert wait_until(done, 30), json.dumps([stats(b) for b in buffers])
    finally:
        client.loop_stop()
        client.disconnect()
    # Assert: all 50 found; one command a kind; every sensor's every report taken, none
    # still waiting to be heard from; the availability shown in the fleet view
    assert len(found["sensors"]) == 50 and {s["kind"] for s in found["sensors"]} == {
        "plain", "json"
    }  # fmt: skip
    kinds = {("plain" if "--payload" in argv else "json"): argv for argv in found["commands"]}
    for kind, argv in kinds.items():
        final = stats(Path(argv[argv.index("--buffer") + 1]))
        assert final["readings"] == want[kind], json.dumps(final)
        assert final["rejected"] == 0 and final["never-reported"] == []
    fleet = subprocess.run(
        fedstream_command("fleet", "--broker", stock.url, "--json"),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = {r["device"]: r for r in json.loads(fleet.stdout)}
    assert wait_until(lambda: _fleet_offline(stock.url) == ["esphome/node3/status"], 10), rows


def _fleet_offline(url: str) -> list[str] | None:
    from deploy.local import fedstream_command

    out = subprocess.run(
        fedstream_command("fleet", "--broker", url, "--json"),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    offline = [r["sensors-offline"] for r in json.loads(out.stdout) if r["sensors-offline"]]
    return offline[0] if offline else None


def start_ingest_argv(procs: ProcessGroup, name: str, options: list[str], where: Path) -> None:
    """``fedstream ingest`` with the options a command line printed, as a child process;
    returns once the broker acknowledged its subscriptions (readings published before that
    would reach no one: on a busy machine the daemon takes seconds to start)."""
    from deploy.local import fedstream_command

    buffer = Path(options[options.index("--buffer") + 1])
    log = where / f"{name}.log"
    procs.start(name, fedstream_command("ingest", *options, "--status-interval", "0.5"),
                log_path=log)  # fmt: skip
    assert wait_until(buffer.exists, 20), log.read_text()
    assert wait_until(lambda: INGEST_SUBSCRIBED_LOG in log.read_text(), 30), log.read_text()


@pytest.mark.timeout(120)
def test_availability_messages_are_acknowledged_and_shown_not_buffered(
    stock: MosquittoBroker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: MQTT 3.1.1, where the broker stops sending a session more than 20 QoS 1
    # messages it has not acknowledged; a sensor whose availability flaps 30 times
    buf = tmp_path / "kitchen.sqlite"
    start_ingest(procs, stock.url, buf, "kitchen", "--mqtt-version", "3.1.1",
                 "--payload", "plain", "--time-field", "none",
                 "--topic", "esphome/kitchen/sensor/+/state", "--fields", "temperature",
                 "--window", "5", "--availability-topic", "esphome/+/status",
                 connected=True)  # fmt: skip
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port_of(stock.url))
    client.loop_start()
    try:
        # Execute: the flapping, then 40 readings, then the sensor gone
        for i in range(30):
            state = "online" if i % 2 else "offline"
            client.publish("esphome/kitchen/status", state, qos=1).wait_for_publish(5)
        for i in range(40):
            topic = "esphome/kitchen/sensor/temperature/state"
            client.publish(topic, f"{20 + i / 10:.1f}", qos=1).wait_for_publish(5)
        client.publish("esphome/kitchen/status", "offline", qos=1).wait_for_publish(5)
        # Assert: every reading taken after the 30 availability messages (each acknowledged),
        # none of those buffered or refused; the last state in the daemon's status
        assert wait_until(lambda: stats(buf).get("readings", 0) >= 40, 30), stats(buf)
        final = stats(buf)
        assert final["readings"] == 40 and final["rejected"] == 0 and final["messages"] == 40
        status = fleet_status(stock.url, "kitchen")
        assert status["availability"] == {"esphome/kitchen/status": "offline"}
        assert status["sensors-offline"] == ["esphome/kitchen/status"]
    finally:
        client.loop_stop()
        client.disconnect()


def fleet_status(url: str, device: str) -> dict[str, object]:
    """The device's retained status as ``fedstream fleet`` reads it, once it names its
    availability."""
    from deploy.fleet_status import FleetView
    from edge_client.runtime.mqtt import BrokerOptions

    def read() -> dict[str, object]:
        with FleetView(BrokerOptions.of(url)) as view:
            assert view.wait_connected(10)
            view.wait_settled()
            return view.snapshot().get(device, {})

    status = read()
    for _ in range(20):  # the daemon publishes every --status-interval (0.5 s here)
        if status.get("sensors-offline"):
            break
        time.sleep(0.5)
        status = read()
    return status
