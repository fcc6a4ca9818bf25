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
from deploy.probes import start_ingest
from edge_client.runtime.buffer import BufferStore

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
