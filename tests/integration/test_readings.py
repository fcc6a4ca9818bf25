"""Per-reading JSON through a real broker into windows: ``mosquitto_pub`` -> broker -> ingest.

The ingest daemon runs as ``fedstream ingest`` (a child process, killed with SIGKILL where the
test says so); the readings are published by ordinary MQTT clients: Mosquitto's own
``mosquitto_pub`` and a plain paho client.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from deploy.bench.forecast import DATA as CO2
from deploy.brokers import EmbeddedBroker, MosquittoBroker
from deploy.constants import FORECAST_LR
from deploy.local import ProcessGroup, wait_until
from deploy.probes import buffer_stats as stats
from deploy.probes import start_ingest
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import RECENT_TIMESTAMPS
from edge_client.runtime.ingest import IngestConfig, IngestDaemon
from edge_client.runtime.mqtt import BrokerURL
from edge_client.runtime.trainer import train_local
from edge_client.runtime.windowing import WindowSpec
from edge_client.task import (
    Classification,
    Forecast,
    evaluate,
    init_model,
    load_series,
    series_windows,
)
from edge_client.wire.constants import NO_LABEL
from edge_client.wire.records import RoundPlan

Broker = EmbeddedBroker | MosquittoBroker
T0 = 1_700_000_000.0
CLASSES = ("walk", "run", "sit")

needs_mosquitto_pub = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None,
    reason="mosquitto_pub not installed (apt-get install -y mosquitto-clients)",
)


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def activity_reading(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """Reading i of a 50 Hz wrist stream: ax counts the readings (to check windows exactly),
    ay's level tells the activity (what a model can learn), az is gravity. The activity
    changes every 20 readings, so a window's label (its last reading's) changes every one."""
    k = (i // 20) % 3
    return {
        "ts": round(T0 + i / 50, 6),
        "acc": {"x": i / 1000, "y": 3.0 * k + float(rng.normal(0, 0.3))},
        "az": 9.8,
        "activity": CLASSES[k],
    }


@needs_mosquitto_pub
def test_mosquitto_pub_readings_are_windowed_exactly_once_across_kill9_and_trained_on(
    broker: Broker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: 3,000 readings, windows of 50 every 20: (3000 - 50) // 20 + 1 = 148 samples
    n, w, s = 3000, 50, 20
    buf = tmp_path / "wrist.sqlite"
    options = (
        "--topic", "site/wrist-1/imu", "--fields", "acc.x,acc.y,az", "--window", str(w),
        "--stride", str(s), "--label-field", "activity", "--classes", ",".join(CLASSES),
    )  # fmt: skip
    start_ingest(procs, broker.url, buf, "wrist-1", *options, connected=True)
    rng = np.random.default_rng(0)
    lines = [json.dumps(activity_reading(i, rng)) for i in range(n)]
    pub = subprocess.Popen(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", port_of(broker.url), "-q", "1",
         "-t", "site/wrist-1/imu", "-l"],
        stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert pub.stdin is not None

    def feed() -> None:  # about 1,000 readings a second, one line (one message) each
        for k in range(0, n, 50):
            pub.stdin.write("\n".join(lines[k : k + 50]) + "\n")  # type: ignore[union-attr]
            pub.stdin.flush()  # type: ignore[union-attr]
            time.sleep(0.05)
        pub.stdin.close()  # type: ignore[union-attr]

    feeder = threading.Thread(target=feed)
    feeder.start()
    # Execute: kill -9 mid-stream, stay down while readings go on, start it again
    assert wait_until(lambda: stats(buf).get("readings", 0) >= 700, 30)
    procs.kill("ingest")
    at_kill = stats(buf)
    time.sleep(1.0)
    start_ingest(procs, broker.url, buf, "wrist-1", *options)
    feeder.join(60)
    assert pub.wait(60) == 0
    assert wait_until(lambda: stats(buf).get("readings", 0) >= n, 60)
    time.sleep(0.5)  # would-be redeliveries have time to show up
    final = stats(buf)
    with BufferStore(buf) as store:
        everything = store.sample(store.fill, np.random.default_rng(0))  # all, unconsumed
        order = np.argsort(everything.ts)
        x, y = everything.x[order], everything.y[order]
        task = Classification(model="mlp", width=8, preprocess="standardize")
        model = init_model(task, (3, w), len(CLASSES), seed=0)
        standardize = task.preprocessor()
        assert standardize is not None
        result = train_local(
            model, store, RoundPlan(8, 18, 0.05), task=task, preprocessor=standardize
        )
        after = evaluate(task, model, standardize(x), y).metric
    # Assert: exactly the windows, each once, the readings of unfinished windows included
    assert 0 < at_kill["readings"] < n
    assert final["readings"] == n and final["rejected"] == 0, json.dumps(final)
    assert final["accepted"] == final["received"] == (n - w) // s + 1 == 148
    assert len(x) == 148
    starts = np.round(x[:, 0, 0] * 1000).astype(int)
    assert starts.tolist() == list(range(0, n - w + 1, s))
    assert np.allclose(x[:, 0, :], (starts[:, None] + np.arange(w)) / 1000)
    last = starts + w - 1
    assert y.tolist() == [(i // 20) % 3 for i in last]  # the window's last reading's label
    assert result.num_examples == 144 and np.isfinite(result.train_loss)
    assert after >= 0.9  # one round of 18 steps learns the activities (chance: 1/3)


def test_a_windowed_transaction_is_acknowledged_before_the_next_one_commits(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-reading JSON is deduplicated by timestamp among RECENT_TIMESTAMPS per topic: were
    two transactions committed and unacknowledged at a kill -9, the broker would redeliver
    both and the older one's readings would be refused as late (lost)."""
    # Prepare: an in-process daemon; at each commit, count the acks of earlier commits that
    # have not been written to the broker yet (queued by the daemon, or in paho's queue).
    spec = WindowSpec.from_options(topics=["site/burst"], fields="acc.x", window=10)
    config = IngestConfig(
        BrokerURL.parse(broker.url), "burst-1", tmp_path / "b.sqlite", windowing=spec
    )
    daemon = IngestDaemon(config)
    owed: list[int] = []
    commit = daemon._commit

    def watched(items: list[Any]) -> None:
        queued = list(daemon._client._out_packet)  # paho's queue of packets to write
        pubacks = sum(1 for p in queued if p["command"] & 0xF0 == mqtt.PUBACK)
        owed.append(len(daemon._acks) + pubacks)
        commit(items)

    monkeypatch.setattr(daemon, "_commit", watched)
    rng = np.random.default_rng(0)
    n = 640  # ten transactions of RECENT_TIMESTAMPS readings, published as one burst
    burst = [("site/burst", activity_reading(i, rng)) for i in range(n)]
    daemon.start()
    try:
        assert wait_until(daemon._connected.is_set, 10)
        # Execute
        publish_in_order(broker.url, burst)  # type: ignore[arg-type]
        assert wait_until(lambda: daemon.store.stats().get("readings", 0) >= n, 30)
    finally:
        daemon.stop()
    # Assert: every commit found the earlier ones' acks written; every reading taken once
    assert len(owed) >= n // RECENT_TIMESTAMPS
    assert max(owed) == 0, owed
    assert stats(tmp_path / "b.sqlite")["rejected"] == 0


def publish_in_order(url: str, messages: list[tuple[str, dict[str, Any] | bytes]]) -> None:
    """Publish with a plain paho client at QoS 1, one connection, in order, once connected;
    wait for acks (a dict goes as JSON, bytes as they are)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{time.monotonic_ns()}")
    client.connect("127.0.0.1", int(port_of(url)))
    client.loop_start()
    try:
        # Before its CONNACK paho queues what is published and, once connected, sends the
        # queue while newer messages go straight out: wait, or the order is not kept.
        assert wait_until(client.is_connected, 10), "the publisher did not connect"
        infos = [
            client.publish(topic, obj if isinstance(obj, bytes) else json.dumps(obj), qos=1)
            for topic, obj in messages
        ]
        for info in infos:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def imu(start: float, stop: float) -> list[tuple[str, dict[str, Any] | bytes]]:
    """Accelerometer at 100 Hz and gyroscope at 50 Hz over [start, stop) s, in time order.
    Both are ramps in time, so their values at any tick are known exactly."""
    acc: list[tuple[float, str, dict[str, Any]]] = [
        (T0 + i / 100, "wrist/acc", {"ax": i / 100, "ay": 1.0})
        for i in range(round(start * 100), round(stop * 100))
    ]
    gyro: list[tuple[float, str, dict[str, Any]]] = [
        (T0 + j / 50, "wrist/gyro", {"g": [2 * j / 50, 0.0, -1.0]})
        for j in range(round(start * 50), round(stop * 50))
    ]
    merged = sorted(acc + gyro, key=lambda m: m[0])
    return [(topic, {"ts": ts, **values}) for ts, topic, values in merged]


def test_two_topics_at_different_rates_align_and_late_labels_join_or_time_out(
    broker: Broker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: acc (100 Hz) and gyro (50 Hz) onto 50 Hz; windows of 50 ticks every 25
    # (ends at 0.98 + 0.5 k s); labels on their own topic, at most 4 s of stream late.
    buf = tmp_path / "wrist.sqlite"
    start_ingest(
        procs, broker.url, buf, "wrist-2",
        "--topic", "wrist/acc=ax,ay", "--topic", "wrist/gyro=g[0:3]", "--rate", "50",
        "--window", "50", "--stride", "25", "--max-gap", "0.1",
        "--label-topic", "wrist/label", "--label-field", "activity", "--classes", "walk,run",
        "--label-wait", "4", connected=True,
    )  # fmt: skip
    labels: list[tuple[str, dict[str, Any] | bytes]] = [
        ("wrist/label", {"ts": T0 + t, "activity": "walk" if t < 2.5 else "run"})
        for t in np.arange(0.0, 5.01, 0.5)
    ]
    labels.append(("wrist/label", {"ts": T0 + 5.5, "activity": "swim"}))  # not a class
    hostile: list[tuple[str, dict[str, Any] | bytes]] = [
        ("wrist/acc", b"\x00not json"),
        ("wrist/acc", {"ts": T0 + 2.0, "ax": "high", "ay": 1.0}),
        ("wrist/gyro", {"ts": T0 + 2.0, "g": [1.0, float("nan"), 0.0]}),
        ("wrist/acc", {"ts": T0 + 0.5, "ax": 0.5, "ay": 1.0}),  # long passed: late
        ("wrist/acc", {"ts": T0 + 299 / 100, "ax": 2.99, "ay": 1.0}),  # again: a duplicate
    ]
    # Execute: 3 s of readings; the labels for 0..5 s; 11 s more readings, no more labels
    publish_in_order(broker.url, imu(0, 3) + hostile)
    assert wait_until(lambda: stats(buf).get("readings", 0) >= 450, 30)
    publish_in_order(broker.url, labels)
    publish_in_order(broker.url, imu(3, 14))
    assert wait_until(lambda: stats(buf).get("readings", 0) >= 2100, 30)
    time.sleep(0.5)
    final = stats(buf)
    with BufferStore(buf) as store:
        got = store.take(1000)
    # Assert: 700 ticks make (700 - 50) // 25 + 1 = 27 windows. Labels reach 5.0 s: the 9
    # ending by then are labelled (walk before 2.5 s); of the rest, those ending more than
    # 4 s before the last reading (13.99 s) timed out, and 8 still wait.
    assert final["readings"] == 2100 and final["duplicates"] == 1
    assert final["rejected-by-reason"] == {
        "unknown-label": 1,
        "bad-json": 1,
        "missing-field": 1,
        "non-finite": 1,
        "late": 1,
    }
    assert final["windows-dropped-by-reason"] == {"label-timeout": 10}
    assert final["windows-held"] == 8 and final["accepted"] == len(got) == 9
    assert got.x.shape == (9, 5, 50)
    ends = got.ts - T0
    assert np.allclose(ends, 0.98 + 0.5 * np.arange(9))
    assert got.y.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    ticks = ends[:, None] - (49 - np.arange(50)) / 50  # every window's 50 tick times
    assert np.allclose(got.x[:, 0], ticks, atol=1e-4)  # ax = t, interpolated at each tick
    assert np.allclose(got.x[:, 2], 2 * ticks, atol=1e-4)  # gyro's g[0] = 2 t
    assert np.all(got.x[:, 1] == 1.0) and np.all(got.x[:, 4] == -1.0)


@needs_mosquitto_pub
def test_a_label_free_series_from_mosquitto_pub_is_windowed_and_forecast_better_than_naive(
    broker: Broker, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: weekly CO2 (a real recording), the first 1,500 weeks as per-reading JSON with
    # millisecond timestamps, one week apart; windows of 52 weeks in + 4 out, every week
    series = load_series(CO2)[:, 0]
    n, w = 1500, 56
    week_ms = 7 * 24 * 3600 * 1000
    buf = tmp_path / "co2.sqlite"
    start_ingest(
        procs, broker.url, buf, "mauna-loa",
        "--topic", "noaa/mlo/co2", "--fields", "co2", "--window", str(w), "--stride", "1",
        "--time-unit", "ms", "--max-gap", str(8 * 24 * 3600), connected=True,
    )  # fmt: skip
    lines = "".join(
        json.dumps({"ts": int(T0 * 1000) + (i - n) * week_ms, "co2": float(series[i])}) + "\n"
        for i in range(n)  # the weeks up to T0 (a reading dated ahead of the clock is refused)
    )
    # Execute
    subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", port_of(broker.url), "-q", "1",
         "-t", "noaa/mlo/co2", "-l"],
        input=lines, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert wait_until(lambda: stats(buf).get("readings", 0) >= n, 30)
    task = Forecast(horizon=4)
    model = init_model(task, (1, w), 1, seed=0)
    with BufferStore(buf) as store:
        windows = store.fill
        result = train_local(model, store, RoundPlan(32, 40, FORECAST_LR), task=task)
    test = series_windows(series[n:], w)
    naive = evaluate(task, init_model(task, (1, w), 1, seed=0), test, np.zeros(len(test)))
    learned = evaluate(task, model, test, np.zeros(len(test)))
    # Assert: n - w + 1 windows, unlabelled; one round of training beats repeating the last
    # reading on the weeks after them (the model starts as exactly that naive forecast)
    assert windows == n - w + 1 and result.taken is not None
    assert set(result.taken.y.tolist()) == {NO_LABEL}
    assert learned.metric < 0.9 * naive.metric
