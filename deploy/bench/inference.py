"""``fedstream bench inference``: does on-device inference keep up with the stream?

Two measurements, wall clock, on this machine (2 shared cores; one torch thread):

- **the model alone**: a built-in model exported as a device keeps it
  (:func:`~edge_client.runtime.model_store.store_model`), loaded with torch alone
  (:func:`~edge_client.wire.artifact.load_version`), predicting batches of 1, 4
  (a publisher's frame) and 64 samples: samples per second, median of 5 repeats;
- **the daemon end to end**: ``fedstream infer`` as a child process with the embedded broker;
  a publisher sends frames of 4 samples as fast as the broker takes them (samples per second
  from the first sample sent to the last prediction received), then paced at the fastest
  stream rate below for 10 s; the latency each prediction reports (from the earliest
  arrival in its batch to the hand-over to the broker).

The stream rates to keep up with: the benchmarks' ScaDLES rate sets (S2: 300 +- 112
samples/s per device, the fastest) and the emulated fleet's 100-400 samples/s.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.bench.common import PROCESS_SOURCES, Result, footnote, markdown_table, verdict
from deploy.brokers import EmbeddedBroker
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import MqttProbe
from edge_client.runtime.model_store import store_model
from edge_client.task.interface import init_model
from edge_client.task.loading import load_task
from edge_client.wire.artifact import latest_version, load_version
from edge_client.wire.constants import RATE_SETS
from edge_client.wire.frames import encode_frame
from edge_client.wire.run_config import RunSettings
from edge_client.wire.topics import predictions_topic, samples_topic

__all__ = ["model_rates", "run"]

MODELS: dict[str, dict[str, Any]] = {
    "cnn (default, width 32)": {},
    "cnn, width 96 (the demo's)": {"model_width": 96},
    "mlp": {"model": "mlp"},
    "forecast (6 x 32+1)": {"task": "forecast", "sample_shape": "6,33"},
}
BATCHES = (1, 4, 64)
FASTEST_RATE = RATE_SETS["S2"][1] + RATE_SETS["S2"][2]  # samples/s: S2's mean + 1 sd
DAEMON_MESSAGES, QUICK_DAEMON_MESSAGES, PER_MESSAGE = 1500, 400, 4
PACED_S, PACED_QUICK_S = 10.0, 3.0  # seconds of a paced stream


def model_rates(settings: RunSettings, tmp: Path, repeats: int = 5) -> dict[int, float]:
    """Samples per second of ``settings``' model, exported and loaded, per batch size."""
    task = load_task(settings)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    store_model(tmp, task, settings, weights, 1, "bench", None)
    loaded = load_version(latest_version(tmp))  # type: ignore[arg-type]
    rates = {}
    for batch in BATCHES:
        x = torch.randn(batch, *task.input_shape(settings.shape))
        calls = max(20, 2000 // batch)
        loaded(x)  # warm up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                loaded(x)
            times.append(time.perf_counter() - t0)
        rates[batch] = calls * batch / statistics.median(times)
    return rates


def daemon_rate(tmp: Path, messages: int, rate: float | None = None) -> dict[str, Any]:
    """``fedstream infer`` end to end: samples per second and reported latencies, with
    frames sent as fast as the broker takes them, or paced at ``rate`` samples/s."""
    settings = RunSettings()
    task = load_task(settings)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    models = tmp / "models"
    store_model(
        models,
        task,
        settings,
        {k: v.numpy() for k, v in model.state_dict().items()},
        1,
        "dev-a",
        None,
    )
    rng = np.random.default_rng(0)
    frames = [
        encode_frame(
            rng.normal(size=(PER_MESSAGE, *settings.shape)),
            np.zeros(PER_MESSAGE, int),
            time.time() + i * PER_MESSAGE + np.arange(PER_MESSAGE),
        )
        for i in range(messages)
    ]
    with EmbeddedBroker() as broker, ProcessGroup() as procs:
        log = tmp / "infer.log"
        procs.start(
            "infer",
            fedstream_command(
                "infer", *broker.client_args, "--device-id", "dev-a", "--model", str(models),
                "--drift", "none",
            ),
            log_path=log,
        )  # fmt: skip
        probe = MqttProbe(broker.url, "bench-probe", mqtt_version=broker.mqtt_version)
        probe.subscribe(predictions_topic("dev-a"))
        if not wait_until(lambda: "connected to" in log.read_text(), 60):
            raise RuntimeError(f"fedstream infer did not connect:\n{log.read_text()}")
        total = messages * PER_MESSAGE
        t0 = time.perf_counter()
        for i, frame in enumerate(frames):
            if rate is not None:  # paced: frame i leaves at i * 4 / rate seconds
                time.sleep(max(0.0, t0 + i * PER_MESSAGE / rate - time.perf_counter()))
            probe.client.publish(samples_topic("dev-a"), frame, qos=1)

        def predicted() -> int:
            return sum(len(json.loads(m.payload)["predictions"]) for m in list(probe.messages))

        done = wait_until(lambda: predicted() >= total, 300, interval=0.2)
        elapsed = time.perf_counter() - t0
        latencies = [
            e["latency-s"]
            for m in list(probe.messages)
            for e in json.loads(m.payload)["predictions"]
        ]
        probe.close()
    return {
        "samples": total,
        "predicted": predicted() if done else len(latencies),
        "seconds": elapsed,
        "samples_per_s": len(latencies) / elapsed,
        "latency_median_s": statistics.median(latencies) if latencies else None,
        "latency_p99_s": float(np.percentile(latencies, 99)) if latencies else None,
        "messages_per_publish": len(probe.messages),
    }


def run(quick: bool = False) -> Result:
    """Model throughput per batch size, then the daemon end to end."""
    torch.set_num_threads(1)
    entries: list[dict[str, Any]] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-inference-") as tmp:
        for i, (name, overrides) in enumerate(MODELS.items()):
            if quick and i > 0:
                break
            rates = model_rates(RunSettings(**overrides), Path(tmp) / f"m{i}")
            entries.append({"model": name, "samples_per_s": rates})
            rows.append([name, *(f"{rates[b]:,.0f}" for b in BATCHES)])
        daemon = daemon_rate(Path(tmp), QUICK_DAEMON_MESSAGES if quick else DAEMON_MESSAGES)
        paced_messages = int(FASTEST_RATE * (PACED_QUICK_S if quick else PACED_S) / PER_MESSAGE)
        paced = daemon_rate(Path(tmp) / "paced", paced_messages, FASTEST_RATE)
    entries.append({"daemon": "fedstream infer, embedded broker, cnn default", **daemon})
    entries.append({"daemon": f"paced at {FASTEST_RATE:.0f} samples/s", **paced})
    slowest_single = min(e["samples_per_s"][1] for e in entries if "model" in e)
    met = (
        daemon["samples_per_s"] >= FASTEST_RATE
        and slowest_single >= FASTEST_RATE
        and paced["predicted"] == paced["samples"]
    )
    table = markdown_table(
        ["model (exported, torch alone)", *(f"samples/s, batch {b}" for b in BATCHES)], rows
    )
    table += "\n\n" + markdown_table(
        ["fedstream infer end to end", "samples/s", "latency median", "latency p99"],
        [
            [
                f"{daemon['samples']} samples in frames of {PER_MESSAGE}, as fast as sent",
                f"{daemon['samples_per_s']:,.0f}",
                f"{1000 * (daemon['latency_median_s'] or 0):.1f} ms",
                f"{1000 * (daemon['latency_p99_s'] or 0):.1f} ms",
            ],
            [
                f"{paced['samples']} samples in frames of {PER_MESSAGE}, paced at "
                f"{FASTEST_RATE:.0f} samples/s",
                f"{paced['samples_per_s']:,.0f}",
                f"{1000 * (paced['latency_median_s'] or 0):.1f} ms",
                f"{1000 * (paced['latency_p99_s'] or 0):.1f} ms",
            ],
        ],
    )
    table += footnote(
        "Wall clock on this 2-core machine, one torch thread, the broker and the publisher on "
        "the same cores. Stream rates of the benchmarks: ScaDLES S2 300 +- 112 samples/s per "
        "device, the emulated fleet 100-400",
        f"keep up with {FASTEST_RATE:.0f} samples/s (S2's mean + 1 sd) per device, one sample at "
        f"a time and end to end: {verdict(met)}",
        virtual_clock=False,
    )
    return Result("inference", entries, table, meta={"quick": quick}, sources=PROCESS_SOURCES)
