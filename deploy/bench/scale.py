"""The aggregator's cost per round as the fleet grows (issue: paper effects, scale).

One round of the real strategy for N devices on a 100k-parameter model: plan (controller and
per-device ConfigRecords), then decode, validate and add N update frames as they arrive, and
feed the controller. Replies are produced lazily, one at a time, as a SuperLink would hand
them over, so the aggregator's own memory is what is measured (``tracemalloc`` peak, in a
separate pass from the timing). Wall-clock time of this process, not the virtual clock.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from matplotlib.axes import Axes

from aggregator.fleet import FleetRegistry
from aggregator.strategy import StreamStrategy
from deploy.bench.common import Panel, Result, footnote, markdown_table, save_figure, verdict
from deploy.inprocess import StaticGrid
from edge_client.wire.codec import encode
from edge_client.wire.records import DeviceReply, ReplyMetrics
from edge_client.wire.run_config import RunSettings

__all__ = ["MODEL_SHAPES", "run"]

MODEL_SHAPES = {"w1": (256, 384), "b1": (256,), "w2": (6, 256), "b2": (6,)}  # 100,102 params
GOALS = {"devices": 1000, "round_s": 2.0}


def _replies(messages: list[Message], frames: list[bytes]) -> Iterator[Message]:
    """Each device's reply, built only when the aggregator asks for the next one."""
    for i, msg in enumerate(messages):
        metrics = ReplyMetrics(
            num_examples=320,
            batch_size=16,
            local_steps=20,
            step_s=0.01 * (1 + i % 4),
            compute_s=0.2,
            train_loss=1.0,
            buffer_fill=1000,
            stream_rate=100.0,
        )
        reply = DeviceReply(f"dev-{msg.metadata.dst_node_id}", metrics, frames[i % len(frames)])
        yield Message(reply.to_content(), reply_to=msg)


def one_round(n: int, mode: str, frames: list[bytes], arrays: ArrayRecord) -> float:
    """Seconds of one planned and aggregated round with ``n`` devices (known by their ids
    from an earlier round, as in a steady fleet)."""
    settings = RunSettings(global_batch=16 * n, b_min=1, b_max=64, compress=mode)
    fleet = FleetRegistry(node_devices={100 + i: f"dev-{100 + i}" for i in range(n)})
    strategy = StreamStrategy(settings, fleet=fleet)
    grid = StaticGrid(range(100, 100 + n))
    t0 = time.perf_counter()
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    ids = grid.push_messages(messages)
    sent = {i: m.metadata.dst_node_id for i, m in zip(ids, messages, strict=True)}
    new, report = strategy.aggregate_train(1, _replies(messages, frames), sent)
    elapsed = time.perf_counter() - t0
    assert new is not None and len(report.replies) == n and not report.refused
    return elapsed


def run(quick: bool = False, seed: int = 0) -> Result:
    """Time and memory per round for growing fleets."""
    sizes = (10, 100, 1000) if quick else (10, 100, 1000, 10000)
    rng = np.random.default_rng(seed)
    arrays = ArrayRecord(
        {k: Array(rng.standard_normal(s).astype(np.float32)) for k, s in MODEL_SHAPES.items()}
    )
    params = sum(int(np.prod(s)) for s in MODEL_SHAPES.values())
    entries: list[dict[str, Any]] = []
    for mode in ("none", "topk"):
        # a few distinct realistic deltas, reused round-robin (decoding is done for each reply)
        frames = [
            encode(
                {
                    k: (rng.standard_normal(s) * 0.01).astype(np.float32)
                    for k, s in MODEL_SHAPES.items()
                },
                mode,
                0.01,
            )
            for _ in range(4)
        ]
        for n in sizes:
            reps = 3 if n <= 1000 else 1
            times = [one_round(n, mode, frames, arrays) for _ in range(reps)]
            gc.collect()
            tracemalloc.start()
            one_round(n, mode, frames, arrays)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            round_s = statistics.median(times)
            entries.append(
                {
                    "devices": n,
                    "mode": mode,
                    "round_s": round_s,
                    "per_device_ms": round_s / n * 1e3,
                    "peak_mb": peak / 2**20,
                    "frame_bytes": len(frames[0]),
                    "params": params,
                }
            )
            print(f"  scale {mode} {n}: {round_s:.3f} s, {peak / 2**20:.1f} MB", flush=True)
    goals = _goals(entries)
    rows = [
        [
            e["mode"],
            f"{e['devices']:,}",
            f"{e['round_s']:.3f} s",
            f"{e['per_device_ms']:.2f} ms",
            f"{e['peak_mb']:.1f} MB",
            f"{e['frame_bytes']:,}",
        ]
        for e in entries
    ]
    table = markdown_table(
        ["update", "devices", "round", "per device", "peak memory", "frame bytes"], rows
    )
    table += footnote(
        "One round of the aggregator's work (plan, decode, validate, aggregate, controller) "
        f"on a {params:,}-parameter model, this process's wall clock on this 2-core machine, "
        "median of 3 (1 at 10,000); peak memory by tracemalloc (the model is "
        f"{params * 4 / 2**20:.2f} MB of float32)",
        goals["text"],
        virtual_clock=False,
    )
    meta = {"quick": quick, "goals": goals}
    return Result("scale", entries, table, meta, [lambda out: _plot(entries, out)])


def _goals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    dense = [e for e in entries if e["mode"] == "none"]
    at = next(e for e in dense if e["devices"] == GOALS["devices"])
    small, large = dense[0], dense[-1]
    growth = (large["round_s"] / large["devices"]) / (dense[1]["round_s"] / dense[1]["devices"])
    model_kb = large["params"] * 4 / 1024
    per_device_kb = (
        (large["peak_mb"] - small["peak_mb"]) * 1024 / (large["devices"] - small["devices"])
    )
    met = {
        "round_s": at["round_s"] <= GOALS["round_s"],
        "linear": growth < 1.5,
        "memory": per_device_kb < 0.05 * model_kb,  # bookkeeping only, never a model copy
    }
    text = (
        f"1,000 devices <= 2 s per round: {at['round_s']:.2f} s "
        f"({verdict(met['round_s'])}); per-device cost at {large['devices']:,} vs "
        f"100 devices: {growth:.2f}x ({'linear' if met['linear'] else 'NOT linear'}); peak "
        f"memory {small['peak_mb']:.1f} MB at {small['devices']} devices, "
        f"{large['peak_mb']:.1f} MB at {large['devices']:,}: {per_device_kb:.1f} kB per extra "
        f"device against a {model_kb:.0f} kB model "
        f"({'O(model)' if met['memory'] else 'NOT O(model)'})"
    )
    return {"met": met, "text": text}


def _plot(entries: list[dict[str, Any]], out: Path) -> Path:
    def draw(axes: list[Axes]) -> None:
        for mode in ("none", "topk"):
            es = [e for e in entries if e["mode"] == mode]
            devices = [e["devices"] for e in es]
            axes[0].plot(devices, [e["round_s"] for e in es], marker="o", label=mode)
            axes[1].plot(devices, [e["peak_mb"] for e in es], marker="o", label=mode)

    panels = [
        Panel("devices", "seconds per round", xscale="log", yscale="log"),
        Panel("devices", "peak MB", xscale="log"),
    ]
    return save_figure(out / "scale.png", panels, draw, width=5.5)
