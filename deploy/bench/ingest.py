"""Ingest throughput: a raw paho subscriber loop vs. the full ingest path into the buffer.

Both drain the same thing: N QoS 1 messages that the broker queued for a persistent session
while the subscriber was away (a feeder published them beforehand). That takes the
publisher's speed out of the figure and measures what the subscriber side can take.
The cases: samples in binary frames (1 or 64 per message), and per-reading JSON (one
6-channel reading per message) that the daemon cuts into windows of 32 readings every 16
(``fedstream ingest --fields ... --window 32 --stride 16``). Then a live run checks that the
ingest daemon's memory stays flat under the truncation policy.

    python -m deploy.bench.ingest [--quick] [--json PATH] [--broker mosquitto|embedded]

All ratios are measured side by side in one run on the same broker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deploy.bench.common import PROCESS_SOURCES, measured_code
from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup, fedstream_command
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import INGEST_SESSION_EXPIRY_S, MQTT_311
from edge_client.runtime.ingest import IngestConfig, IngestDaemon
from edge_client.runtime.mqtt import BrokerOptions, BrokerURL, connect_async, make_client
from edge_client.runtime.windowing import WindowSpec
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import encode_frame
from edge_client.wire.readings import encode_readings
from edge_client.wire.topics import samples_topic

DEVICE = "bench"
READING_FIELDS = "ax,ay,az,gx,gy,gz"  # the per-reading case: a 6-axis IMU reading a message
READING_WINDOW, READING_STRIDE = 32, 16


def _connected_client(
    url: BrokerURL, client_id: str, max_inflight: int = 20, **kw: Any
) -> mqtt.Client:
    ready = threading.Event()
    client = make_client(client_id, url, **kw)
    client.max_inflight_messages_set(max_inflight)
    client.on_connect = lambda *_: ready.set()
    connect_async(client, url)
    if not ready.wait(10):
        raise RuntimeError(f"{client_id}: no connection to {url}")
    return client


def make_session(url: BrokerURL, client_id: str) -> None:
    """Create a persistent session subscribed to the samples topic, then leave."""
    client = _connected_client(url, client_id, session_expiry=INGEST_SESSION_EXPIRY_S)
    client.subscribe(samples_topic(DEVICE), qos=1)
    time.sleep(0.3)
    client.disconnect()
    client.loop_stop()


def reading_payload(seq: int, rng: np.random.Generator) -> bytes:
    """Reading ``seq`` of a 100 Hz 6-axis IMU as per-reading JSON."""
    values = rng.standard_normal(6).round(4).tolist()
    return encode_readings([1.7e9 + seq / 100], [values], READING_FIELDS.split(","))


def preload(
    url: BrokerURL, messages: int, per_message: int, shape: tuple[int, ...], readings: bool = False
) -> int:
    """Publish ``messages`` frames of ``per_message`` samples (or, ``readings``, per-reading
    JSON messages) at QoS 1; wait for every ack."""
    task = SensorTask(shape) if len(shape) == 2 else None
    rng = np.random.default_rng(0)
    pool = []
    for i in range(64):  # a pool of distinct frames, re-stamped with their sequence number
        if task is not None:
            x, y = task.sample(per_message, rng)
        else:  # single sensor readings
            x = rng.standard_normal((per_message, *shape)).astype(np.float32)
            y = rng.integers(0, 6, per_message)
        pool.append((x, y, np.full(per_message, 1.7e9 + i)))
    client = _connected_client(url, "bench-feeder", max_inflight=1000)
    acked = 0

    def on_publish(*_: Any) -> None:
        nonlocal acked
        acked += 1

    client.on_publish = on_publish
    for seq in range(messages):
        if readings:
            payload = reading_payload(seq, rng)
        else:
            x, y, ts = pool[seq % len(pool)]
            payload = encode_frame(x, y, ts, publisher="feed", seq=seq)
        client.publish(samples_topic(DEVICE), payload, 1)
        while seq - acked > 5000:
            time.sleep(0.001)
    deadline = time.monotonic() + 120
    while acked < messages and time.monotonic() < deadline:
        time.sleep(0.01)
    client.disconnect()
    client.loop_stop()
    return acked


def drain_raw(url: BrokerURL, messages: int) -> float:
    """Seconds for a plain paho subscriber (auto-ack, count only) to receive everything."""
    done = threading.Event()
    count = 0
    t0 = 0.0

    def on_message(*_: Any) -> None:
        nonlocal count
        count += 1
        if count == messages:
            done.set()

    client = make_client("bench-raw", url, session_expiry=INGEST_SESSION_EXPIRY_S)
    client.on_message = on_message

    def on_connect(c: mqtt.Client, *_: Any) -> None:
        nonlocal t0
        t0 = time.perf_counter()
        c.subscribe(samples_topic(DEVICE), qos=1)

    client.on_connect = on_connect
    connect_async(client, url)
    if not done.wait(300):
        raise RuntimeError(f"raw subscriber got {count} of {messages}")
    elapsed = time.perf_counter() - t0
    client.disconnect()
    client.loop_stop()
    return elapsed


def drain_ingest(samples: int, config: IngestConfig, counter: str = "received") -> float:
    """Seconds for the ingest daemon to commit (and acknowledge) everything: ``samples`` of
    the buffer's ``counter`` (``readings`` for per-reading JSON)."""
    buffer = config.buffer
    daemon = IngestDaemon(config)
    reader = BufferStore(buffer)
    t0 = time.perf_counter()  # from the connection (the broker sends right after CONNACK)
    daemon.start()
    daemon.wait_connected(30)
    deadline = time.monotonic() + 300
    while reader.stats().get(counter, 0) < samples and time.monotonic() < deadline:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    got = reader.stats().get(counter, 0)
    daemon.stop()
    reader.close()
    if got != samples:
        raise RuntimeError(f"ingest committed {got} of {samples} samples")
    return elapsed


def throughput_case(
    url: BrokerURL,
    per_message: int,
    messages: int,
    shape: tuple[int, ...],
    reps: int,
    tmp: Path,
    readings: bool = False,
) -> dict[str, Any]:
    """Raw and ingest drains of the same preloaded queue, alternated ``reps`` times.

    With ``readings`` the messages are per-reading JSON, windowed on ingest; the figures
    then count readings (what arrives), and the windows made are reported beside them.
    """
    raw: list[float] = []
    ingest: list[float] = []
    spec = None
    if readings:
        spec = WindowSpec.from_options(
            topics=[samples_topic(DEVICE)],
            fields=READING_FIELDS,
            window=READING_WINDOW,
            stride=READING_STRIDE,
        )
        shape = spec.shape
    version = BrokerOptions.of(url).protocol
    for rep in range(reps):
        make_session(url, "bench-raw")
        make_session(url, "bench-ingest")
        acked = preload(url, messages, per_message, shape, readings)  # queued for both
        assert acked == messages, f"feeder: {acked} of {messages} acknowledged"
        raw.append(drain_raw(url, messages))
        config = IngestConfig(
            broker=url,
            device_id=DEVICE,
            buffer=tmp / f"b{per_message}-{len(shape)}-{readings}-{version}-{rep}.sqlite",
            capacity=10**9,
            shape=shape,
            client_id="bench-ingest",
            windowing=spec,
        )
        counter = "readings" if readings else "received"
        ingest.append(drain_ingest(messages * per_message, config, counter))
    raw_s, ingest_s = statistics.median(raw), statistics.median(ingest)
    sample_bytes = 4 * math.prod(shape) + 16
    return {
        "kind": "per-reading JSON, windowed" if readings else "binary frames",
        "mqtt-version": version,
        "samples-per-message": per_message,
        "shape": list(shape),
        "sample-bytes": sample_bytes,
        "messages": messages,
        "repetitions": reps,
        "raw-msg-s": messages / raw_s,
        "ingest-msg-s": messages / ingest_s,
        "raw-samples-s": messages * per_message / raw_s,
        "ingest-samples-s": messages * per_message / ingest_s,
        "ingest-mb-s": messages * per_message * sample_bytes / ingest_s / 1e6,
        "ratio": raw_s / ingest_s,
        "ratios": [r / i for r, i in zip(raw, ingest, strict=True)],
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def memory_case(connect: list[str], seconds: float, tmp: Path) -> dict[str, Any]:
    """RSS of a live ``fedstream ingest`` (truncation) under a steady 64-sample stream."""
    buf = tmp / "mem.sqlite"
    samples: list[tuple[float, int]] = []
    with ProcessGroup() as group:
        daemon = group.start(
            "ingest",
            fedstream_command(
                "ingest",
                *connect,
                "--device-id",
                "mem",
                "--buffer",
                str(buf),
                "--policy",
                "truncation",
                "--capacity",
                "20000",
            ),
            log_path=tmp / "mem.log",
        )
        time.sleep(1.0)
        group.start(
            "pub",
            fedstream_command(
                "publish",
                *connect,
                "--device-id",
                "mem",
                "--rate",
                "20000",
                "--batch",
                "64",
                "--duration",
                str(seconds),
            ),
            log_path=tmp / "mem-pub.log",
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            samples.append((time.monotonic() - t0, rss_kib(daemon.pid)))
            time.sleep(1.0)
    with BufferStore(buf) as store:
        s = store.stats()
    warm = [r for t, r in samples if t >= min(10.0, seconds / 3)]
    return {
        "seconds": seconds,
        "rss-kib-after-warmup": warm[0],
        "rss-kib-end": warm[-1],
        "rss-kib-max": max(warm),
        "growth-after-warmup": warm[-1] / warm[0],
        "rss-kib-series": [r for _, r in samples],
        "accepted": s["accepted"],
        "dropped": s["dropped"],
        "fill": s["fill"],
        "db-bytes": sum(p.stat().st_size for p in tmp.glob("mem.sqlite*")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (CI smoke)")
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--broker", choices=["mosquitto", "embedded"], default=None)
    args = parser.parse_args()
    kind = args.broker or ("mosquitto" if mosquitto_available() else "embedded")
    small, big, seconds, reps = (5000, 500, 15.0, 1) if args.quick else (50_000, 4000, 60.0, 3)
    window: tuple[int, ...] = (6, 32)
    reading: tuple[int, ...] = (6,)
    broker = MosquittoBroker() if kind == "mosquitto" else EmbeddedBroker()
    version = broker.mqtt_version  # the daemons' default where the broker speaks it: MQTT 5
    cases = [(1, small, window, False, version), (64, big, window, False, version)]
    cases += [(64, big, reading, False, version), (1, small, window, True, version)]
    if version != MQTT_311:  # what MQTT 5 costs paho, which decodes its properties in Python
        cases.append((1, small, window, False, MQTT_311))
    # What it measured (``dev/bench_results.py --check`` holds it to them): the daemons it
    # starts load the project in processes of their own.
    results: dict[str, Any] = {
        "scenario": "ingest",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **measured_code(PROCESS_SOURCES),
        "quick": args.quick,
        "broker": kind,
        "cores": os.cpu_count(),
        "cases": [],
    }
    with broker, tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for per, n, shape, readings, mqtt_version in cases:
            url = BrokerOptions.of(broker.url, mqtt_version=mqtt_version)
            case = throughput_case(url, per, n, shape, reps, tmp, readings)
            results["cases"].append(case)
            what = (
                f"per-reading JSON, windows of {READING_WINDOW} every {READING_STRIDE}"
                if readings
                else f"{per:>2} x {case['sample-bytes']} B samples/msg"
            ) + f", MQTT {mqtt_version}"
            print(
                f"{what}, {n} msgs, median of {reps}: "
                f"raw {case['raw-msg-s']:,.0f} msg/s, ingest {case['ingest-msg-s']:,.0f} msg/s "
                f"= {case['ingest-samples-s']:,.0f} {'readings' if readings else 'samples'}/s "
                f"({case['ingest-mb-s']:.0f} MB/s), "
                f"ingest/raw {case['ratio']:.2f}x",
                flush=True,
            )
        mem = memory_case(broker.client_args, seconds, tmp)
        results["memory"] = mem
        print(
            f"memory over {seconds:.0f} s (truncation, 20k samples/s in 64-sample messages): "
            f"RSS {mem['rss-kib-after-warmup'] / 1024:.1f} MiB after warm-up -> "
            f"{mem['rss-kib-end'] / 1024:.1f} MiB at end (x{mem['growth-after-warmup']:.3f}); "
            f"accepted {mem['accepted']:,}, dropped {mem['dropped']:,}, fill {mem['fill']:,}",
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
