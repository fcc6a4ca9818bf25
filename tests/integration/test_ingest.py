"""End to end through a real broker: publisher -> broker -> ingest daemon -> buffer."""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from deploy.brokers import EmbeddedBroker, MosquittoBroker
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import MqttProbe, publish_report, start_ingest, start_publisher
from deploy.probes import buffer_stats as stats
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.injection import inject_pool_path
from edge_client.runtime.outbox import Outbox
from edge_client.wire.constants import INJECT_TOPIC
from edge_client.wire.frames import FrameError, decode_payload, encode_frame, encode_json
from edge_client.wire.topics import samples_topic, status_topic

Broker = EmbeddedBroker | MosquittoBroker


@pytest.fixture
def buf(broker: Broker, procs: ProcessGroup, tmp_path: Path) -> Path:
    """dev-a's buffer, with an ingest daemon (``procs``' "ingest") on ``broker`` writing it."""
    path = tmp_path / "dev-a.sqlite"
    start_ingest(procs, broker.url, path, connected=True)
    return path


def test_counts_match_exactly_at_qos1(broker: Broker, procs: ProcessGroup, tmp_path: Path) -> None:
    # Prepare
    buf = tmp_path / "dev-a.sqlite"
    start_ingest(procs, broker.url, buf, "dev-a", "--log-interval", "0.5", connected=True)
    # Execute
    pub = start_publisher(
        procs, broker.url, "dev-a", "--count", "3000", "--rate", "3000", "--batch", "5"
    )
    report = publish_report(pub)
    # Assert
    assert report["samples"] == 3000 and report["acknowledged"] == report["messages"] == 600
    assert wait_until(lambda: stats(buf)["received"] >= 3000, 30)
    status = subprocess.run(
        fedstream_command("status", "--buffer", str(buf), "--json"),
        capture_output=True,
        check=True,
        timeout=60,
    )
    s = json.loads(status.stdout)
    assert (s["accepted"], s["rejected"], s["dropped"], s["duplicates"]) == (3000, 0, 0, 0)
    assert s["fill"] == 3000 and s["consumed"] == 0 and "rate" in s
    # ... and the daemon's log says, every --log-interval, what came in and whether it is
    # connected.
    assert wait_until(lambda: "(3000 in all)" in buf.with_suffix(".log").read_text(), 10)
    assert "samples/s accepted over" in buf.with_suffix(".log").read_text()


def test_kill9_restart_loses_and_duplicates_nothing(
    broker: Broker, procs: ProcessGroup, buf: Path
) -> None:
    # Prepare: a stream of 4000 samples over ~8 s.
    pub = start_publisher(
        procs, broker.url, "dev-a", "--count", "4000", "--rate", "500", "--batch", "4"
    )
    assert wait_until(lambda: stats(buf)["accepted"] >= 600, 30)
    # Execute: kill -9 mid-stream, stay down ~1.5 s while publishing goes on, restart.
    procs.kill("ingest")
    at_kill = stats(buf)["accepted"]
    time.sleep(1.5)
    start_ingest(procs, broker.url, buf)
    report = publish_report(pub)
    # Assert: exactly the published samples, each once.
    assert wait_until(lambda: stats(buf)["received"] >= report["samples"], 60)
    time.sleep(1.0)  # would-be redeliveries have time to show up
    s = stats(buf)
    assert 0 < at_kill < report["samples"] == 4000
    assert s["accepted"] == s["received"] == 4000
    with BufferStore(buf) as store:
        taken = store.take(10_000)
    digests = {hashlib.sha1(row.tobytes()).digest() for row in taken.x}
    assert len(taken) == 4000 and len(digests) == 4000


def test_stream_rate_is_estimated_within_10_percent(
    broker: Broker, procs: ProcessGroup, buf: Path
) -> None:
    pub = start_publisher(
        procs, broker.url, "dev-a", "--duration", "9", "--rate", "200", "--batch", "4"
    )
    time.sleep(7.5)
    rate = stats(buf)["rate"]
    publish_report(pub)
    assert abs(rate - 200) <= 20, rate


def test_hostile_input_is_counted_and_the_daemon_survives(
    broker: Broker, procs: ProcessGroup, buf: Path, frames
) -> None:
    # Prepare
    client = MqttProbe(broker.url, "hostile")
    assert client.wait_connected()
    topic = samples_topic("dev-a")
    rng = np.random.default_rng(3)
    nan_x = np.zeros((2, 6, 32), np.float32)
    nan_x[0, 0, 0] = np.nan
    huge = bytearray(frames(2))
    huge[8:12] = (2**31).to_bytes(4, "little")
    hostile = {
        "bad-magic": [rng.bytes(64) for _ in range(5)],
        "truncated": [frames(3)[:-10], frames(2)[:30]],
        "shape-mismatch": [encode_frame(np.zeros((2, 3, 64)), [0, 1], [1.0, 2.0])],
        "non-finite": [encode_frame(nan_x, [0, 1], [1.0, 2.0])],
        "count-too-large": [bytes(huge)],
        "bad-utf8": [b'{"x": [\xff\xfe], "y": 1}'],
        "bad-json": [b'{"x": [1, 2', b"[{}]"],
        "bad-label": [encode_json(np.zeros(192), 99)],
        "empty": [b"[]"],
    }
    # Execute: hostile messages interleaved with 5 valid ones of 3 samples each.
    seq = 0
    for payloads in hostile.values():
        for payload in payloads:
            client.publish(topic, payload)
        client.publish(topic, frames(3, publisher="ok", seq=seq))
        seq += 1
    client.publish(topic, encode_json(np.ones(192), 2))
    # Assert
    expected = {reason: len(p) for reason, p in hostile.items()}
    assert wait_until(lambda: stats(buf)["messages"] >= sum(expected.values()) + seq + 1, 20)
    s = stats(buf)
    client.close()
    assert procs.procs["ingest"].poll() is None  # alive
    assert s["rejected-by-reason"] == expected
    assert s["accepted"] == 3 * seq + 1 and s["rejected"] == sum(expected.values())
    assert procs.stop("ingest") == 0


def test_sigterm_flushes_and_exits_zero_and_status_is_retained(
    broker: Broker, procs: ProcessGroup, tmp_path: Path
) -> None:
    buf = tmp_path / "dev-a.sqlite"
    start_ingest(procs, broker.url, buf, "dev-a", "-v")
    report = publish_report(
        start_publisher(
            procs, broker.url, "dev-a", "--count", "1000", "--rate", "2000", "--batch", "10"
        )
    )
    watcher = MqttProbe(broker.url, "watcher")
    watcher.subscribe(status_topic("dev-a"))
    assert wait_until(lambda: watcher.last_json().get("accepted", 0) >= 1000, 20)
    online = watcher.last_json()

    procs.procs["ingest"].send_signal(signal.SIGTERM)
    rc = procs.procs["ingest"].wait(30)

    assert rc == 0 and stats(buf)["accepted"] == report["samples"] == 1000
    assert online["online"] is True and online["device-id"] == "dev-a"
    assert {"rate", "fill", "accepted", "rejected", "dropped", "consumed"} <= set(online)
    assert wait_until(lambda: watcher.last_json().get("online") is False, 10)
    watcher.close()
    # With -v, paho's own log is in the daemon's, through Python logging at DEBUG.
    log = buf.with_suffix(".log").read_text()
    assert "DEBUG paho.mqtt.client: Sending CONNECT" in log
    assert "DEBUG paho.mqtt.client: Received CONNACK" in log


def test_ingest_refuses_bad_configuration(tmp_path: Path) -> None:
    cases = [
        (["--device-id", "bad/id"], "device id"),
        (["--device-id", "d", "--broker", "http://x"], "scheme"),
        (["--device-id", "d", "--capacity", "0"], "capacity"),
        (["--device-id", "d", "--shape", "6,zero"], "shape"),
        (["--device-id", "d", "--fields", "ax"], "needs --window"),
        (["--device-id", "d", "--fields", "ax,ay", "--window", "8", "--shape", "3,8"], "2,8"),
        (["--device-id", "d", "--fields", "a..b", "--window", "8"], "imu.acc.x"),
        (["--device-id", "d", "--topic", "a=x", "--topic", "b=y", "--window", "8"], "--rate"),
        (["--device-id", "d", "--fields", "x", "--window", "8", "--label-field", "y"], "--classes"),
    ]
    for args, message in cases:
        proc = subprocess.run(
            fedstream_command("ingest", "--buffer", str(tmp_path / "b.sqlite"), *args),
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 2, args
        assert message in (proc.stderr + proc.stdout).decode(), (args, proc.stderr)


# -- data injection (ScaDLES) --------------------------------------------------------------


def test_ingest_inject_keeps_others_samples_apart_and_publishes_the_outbox(
    tmp_path: Path, broker: Broker, procs: ProcessGroup, frames: Callable[..., bytes]
) -> None:
    # Prepare: dev-a opted in, dev-c did not; a watcher on the injection topic.
    a, c = tmp_path / "dev-a.sqlite", tmp_path / "dev-c.sqlite"
    for path, device in ((a, "dev-a"), (c, "dev-c")):  # dev-c's must never leave
        BufferStore(path, shape=(6, 32)).close()
        with Outbox(path) as outbox:
            outbox.put([frames(n=5, publisher=device, seq=1)])
    watcher = MqttProbe(broker.url, "watcher")
    watcher.subscribe(INJECT_TOPIC)
    start_ingest(procs, broker.url, a, "dev-a", "--inject", name="ingest-a")
    start_ingest(procs, broker.url, c, "dev-c", name="ingest-c")
    sender = MqttProbe(broker.url, "dev-b")
    assert sender.wait_connected()
    # Execute: dev-a's outbox goes out; dev-b shares samples and sends garbage.
    assert wait_until(lambda: len(watcher.messages) >= 1, 20)
    time.sleep(1.0)
    sender.publish(INJECT_TOPIC, frames(n=7, publisher="dev-b", seq=1))
    sender.publish(INJECT_TOPIC, b"\x00garbage")
    pool = inject_pool_path(a)
    assert wait_until(lambda: pool.exists() and stats(pool)["received"] >= 7, 20)
    assert wait_until(lambda: stats(pool)["rejected"] >= 1, 20)
    # Assert
    publishers = []
    for m in watcher.messages:
        with contextlib.suppress(FrameError):
            publishers.append(decode_payload(m.payload, (6, 32), 6, now=0.0).publisher)
    assert "dev-a" in publishers and "dev-c" not in publishers
    assert stats(pool)["accepted"] == 7  # dev-b's; dev-a's own came back and was skipped
    assert stats(a)["accepted"] == 0  # nothing injected reached the device's own buffer
    assert not inject_pool_path(c).exists()
    with Outbox(c) as outbox:
        assert len(outbox.pending()) == 1  # never published
    with Outbox(a) as outbox:
        assert outbox.pending() == []
    watcher.close()
    sender.close()


def test_publish_streams_digit_frames_into_a_buffer(
    tmp_path: Path, broker: Broker, procs: ProcessGroup
) -> None:
    buffer = tmp_path / "cam-1.sqlite"
    start_ingest(procs, broker.url, buffer, "cam-1", "--shape", "8,8", "--num-classes", "10")

    proc = subprocess.run(
        fedstream_command(
            "publish",
            "--broker",
            broker.url,
            "--device-id",
            "cam-1",
            "--source",
            "digits",
            "--num-classes",
            "10",
            "--classes",
            "3",
            "--rate",
            "500",
            "--count",
            "200",
            "--batch",
            "10",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    assert wait_until(lambda: stats(buffer)["accepted"] == 200, 20)
    with BufferStore(buffer) as store:
        taken = store.take(200)
    assert taken.x.shape == (200, 8, 8) and set(taken.y.tolist()) == {3}
