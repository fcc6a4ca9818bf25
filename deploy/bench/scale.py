"""The aggregator's cost per round as the fleet grows (issue: paper effects, scale).

Rounds of the real strategy for N devices on a 100k-parameter model, through the message
exchange the ServerApp uses (:func:`aggregator.exchange.exchange`): plan (controller and
per-device ConfigRecords), push, then pull the replies and decode, validate and add each
update frame as it is pulled, and feed the controller. The grid stands in for a SuperLink
whose devices have all answered: it makes each reply when it is pulled, with its own copy of
an update frame (bytes off the wire), and hands a pull's replies back as a list, as Flower's
grids do; so the aggregator's own memory is what is measured (``tracemalloc`` over one
more round after the timed ones, untimed). Steady state: rounds 4 and 5, once the controller
has fitted each device's step-time model (round 1 shares the batch equally, round 2 follows
the first timings, round 3 fits). Wall-clock time of this process, not the virtual clock.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from matplotlib.axes import Axes

from aggregator.device_registry import FleetRegistry
from aggregator.exchange import PULL_BATCH, exchange
from aggregator.strategy import StreamStrategy
from deploy.bench.common import Panel, Result, footnote, markdown_table, save_figure, verdict
from deploy.inprocess import StaticGrid
from edge_client.wire.codec import encode
from edge_client.wire.records import CONFIG, DeviceReply, ReplyMetrics, RoundPlan
from edge_client.wire.run_config import RunSettings

__all__ = [
    "MODEL_SHAPES",
    "ROUNDS",
    "STEADY_FROM",
    "FleetRounds",
    "ReplyingGrid",
    "results_table",
    "rounds",
    "run",
]

MODEL_SHAPES = {"w1": (256, 384), "b1": (256,), "w2": (6, 256), "b2": (6,)}  # 100,102 params
GOALS = {"devices": 1000, "round_s": 2.0}
ROUNDS = 5  # per run; rounds STEADY_FROM.. are reported
STEADY_FROM = 4  # the controller has fitted by then
FIRST_NODE = 100
STEP_OVERHEAD_S = 0.005  # a device's step time: overhead + per-sample cost x batch,
PER_SAMPLE_S = 0.001  # the per-sample cost 1x to 4x by device (the controller's input)


class ReplyingGrid(StaticGrid):
    """A SuperLink stand-in whose devices have all answered by the time they are asked.

    ``pull_messages`` returns the replies to the ids asked for (a list, as Flower's grids
    return them), each made then from its message's plan: the batch and steps planned, a
    step time from the device's speed, and its own copy of an update frame (``frames``,
    round-robin); a message is forgotten once its reply is pulled.
    """

    def __init__(self, node_ids: Iterable[int], frames: list[bytes]) -> None:
        super().__init__(node_ids)
        self.frames = frames
        self._pushed: dict[str, Message] = {}
        self.busy_s = 0.0  # wall seconds spent making replies

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Accept the messages; their replies are made when pulled."""
        messages = list(messages)
        ids = self.assign_ids(messages)
        self._pushed.update(zip(ids, messages, strict=True))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to these messages (every device has answered)."""
        t0 = time.perf_counter()
        replies = [self._reply(self._pushed.pop(i)) for i in message_ids if i in self._pushed]
        self.busy_s += time.perf_counter() - t0
        return replies

    def _reply(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        i = node - FIRST_NODE
        plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
        b, steps = plan.batch_size, plan.local_steps
        step_s = STEP_OVERHEAD_S + PER_SAMPLE_S * (1 + i % 4) * b
        metrics = ReplyMetrics(
            num_examples=b * steps,
            batch_size=b,
            local_steps=steps,
            lr=plan.lr,
            step_s=step_s,
            compute_s=step_s * steps,
            train_loss=1.0,
            buffer_fill=1000,
            stream_rate=100.0,
        )
        frame = bytes(memoryview(self.frames[i % len(self.frames)]))  # a copy, as received
        reply = DeviceReply(f"dev-{node}", metrics, frame)
        return Message(reply.to_content(), reply_to=msg)


@dataclass
class FleetRounds:
    """What :func:`rounds` measured.

    Attributes
    ----------
    times, cpu : list of float
        Wall and CPU seconds of each round (a traced round's are slowed by ``tracemalloc``).
    grid : list of float
        Wall seconds of each round that the stand-in SuperLink spent making the replies (in
        ``times``: where a real ServerApp would spend them reading a pull's replies).
    peak : int
        ``tracemalloc``'s peak over the traced rounds, bytes: what they allocated on top of
        what the aggregator held as they began (0 when none was traced).
    """

    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    grid: list[float] = field(default_factory=list)
    peak: int = 0


def rounds(
    n: int,
    mode: str,
    frames: list[bytes],
    arrays: ArrayRecord,
    count: int = ROUNDS,
    trace_from: int | None = None,
) -> FleetRounds:
    """``count`` rounds with ``n`` devices (known by their ids from an earlier run, as in a
    steady fleet), as the ServerApp runs them: plan, :func:`exchange`, aggregate the replies
    as they are pulled, the round's time to the strategy. Rounds from ``trace_from`` on run
    under ``tracemalloc``.
    """
    settings = RunSettings(global_batch=16 * n, b_min=1, b_max=64, compress=mode)
    fleet = FleetRegistry(node_devices={FIRST_NODE + i: f"dev-{FIRST_NODE + i}" for i in range(n)})
    strategy = StreamStrategy(settings, fleet=fleet)
    grid = ReplyingGrid(range(FIRST_NODE, FIRST_NODE + n), frames)
    result = FleetRounds()
    try:
        for server_round in range(1, count + 1):
            if server_round == trace_from:
                gc.collect()
                tracemalloc.start()
            t0, c0, g0 = time.perf_counter(), time.process_time(), grid.busy_s
            messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
            done = exchange(grid, messages, settings.round_timeout)
            new, report = strategy.aggregate_train(server_round, done.replies, done.sent)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            strategy.record_round_time(elapsed)
            assert new is not None and len(report.replies) == n
            assert not report.refused and not report.failed
            arrays = new
            result.times.append(elapsed)
            result.cpu.append(cpu)
            result.grid.append(grid.busy_s - g0)
        if tracemalloc.is_tracing():
            result.peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result


#: Per (mode, fleet size): the steady rounds' wall seconds, CPU seconds and grid seconds.
Steady = dict[tuple[str, int], list[float]]


def run(quick: bool = False, seed: int = 0) -> Result:
    """Time and memory per steady-state round for growing fleets."""
    sizes = (10, 100, 1000) if quick else (10, 100, 1000, 10000)
    rng = np.random.default_rng(seed)
    arrays = ArrayRecord(
        {k: Array(rng.standard_normal(s).astype(np.float32)) for k, s in MODEL_SHAPES.items()}
    )
    params = sum(int(np.prod(s)) for s in MODEL_SHAPES.values())
    modes = ("none", "topk")
    # a few distinct realistic deltas per mode, reused round-robin (each reply is decoded)
    frames = {
        mode: [
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
        for mode in modes
    }
    steady, steady_cpu, steady_grid, peaks = _measure(sizes, 1 if quick else 3, frames, arrays)
    entries: list[dict[str, Any]] = []
    for mode in modes:
        for n in sizes:
            round_s = statistics.median(steady[mode, n])
            entries.append(
                {
                    "devices": n,
                    "mode": mode,
                    "round_s": round_s,
                    "round_times_s": steady[mode, n],
                    "cpu_s": statistics.median(steady_cpu[mode, n]),
                    "round_cpu_s": steady_cpu[mode, n],
                    "grid_s": statistics.median(steady_grid[mode, n]),
                    "per_device_ms": round_s / n * 1e3,
                    "peak_mb": peaks[mode, n] / 2**20,
                    "frame_bytes": len(frames[mode][0]),
                    "params": params,
                }
            )
    goals = _goals(entries)
    table = results_table(entries) + _footnote(quick, params, goals["text"])
    meta = {
        "quick": quick,
        "goals": goals,
        "rounds": ROUNDS,
        "steady_from": STEADY_FROM,
        "pull_batch": PULL_BATCH,
    }
    return Result("scale", entries, table, meta, [lambda out: _plot(entries, out)])


def _measure(
    sizes: Sequence[int], reps: int, frames: dict[str, list[bytes]], arrays: ArrayRecord
) -> tuple[Steady, Steady, Steady, dict[tuple[str, int], int]]:
    """Run every fleet size in every mode (of ``frames``) ``reps`` times; the steady rounds'
    wall, CPU and grid seconds per (mode, size), and the traced round's peak memory."""
    modes = tuple(frames)
    steady: Steady = {(m, n): [] for m in modes for n in sizes}
    steady_cpu: Steady = {(m, n): [] for m in modes for n in sizes}
    steady_grid: Steady = {(m, n): [] for m in modes for n in sizes}
    peaks: dict[tuple[str, int], int] = {}
    # Sizes and modes alternate within each repetition, so that a load from another process
    # on this shared machine falls on all of them rather than on one. The first run of each
    # goes on for one more round, traced (untimed): its memory.
    for rep in range(reps):
        for n in sizes:
            if n > 1000 and rep > 0:
                continue  # 10,000 devices: one run (two steady rounds)
            for mode in modes:
                run_ = rounds(
                    n,
                    mode,
                    frames[mode],
                    arrays,
                    ROUNDS + (rep == 0),
                    ROUNDS + 1 if rep == 0 else None,
                )
                steady[mode, n] += run_.times[STEADY_FROM - 1 : ROUNDS]
                steady_cpu[mode, n] += run_.cpu[STEADY_FROM - 1 : ROUNDS]
                steady_grid[mode, n] += run_.grid[STEADY_FROM - 1 : ROUNDS]
                if rep == 0:
                    peaks[mode, n] = run_.peak
                print(
                    f"  scale {mode} {n:,} (run {rep + 1}): rounds {STEADY_FROM}-{ROUNDS} "
                    + ", ".join(f"{t:.3f}" for t in run_.times[STEADY_FROM - 1 : ROUNDS])
                    + f" s; a round's peak {peaks[mode, n] / 2**20:.1f} MB",
                    flush=True,
                )
    return steady, steady_cpu, steady_grid, peaks


def results_table(entries: Sequence[dict[str, Any]]) -> str:
    """The results table: the steady rounds' figures per update mode and fleet size.

    Parameters
    ----------
    entries : sequence of dict
        :func:`run`'s entries (as in ``scale.json``).

    Returns
    -------
    str
        Round time, per device, round CPU, peak memory and frame bytes, as a markdown table.
    """
    rows = [
        [
            e["mode"],
            f"{e['devices']:,}",
            f"{e['round_s']:.3f} s",
            f"{e['per_device_ms']:.2f} ms",
            f"{e['cpu_s']:.3f} s",
            f"{e['peak_mb']:.1f} MB",
            f"{e['frame_bytes']:,}",
        ]
        for e in entries
    ]
    return markdown_table(
        [
            "update",
            "devices",
            "round",
            "per device",
            "round CPU",
            "a round's peak memory",
            "frame bytes",
        ],
        rows,
    )


def _footnote(quick: bool, params: int, goals: str) -> str:
    """The setup under the table, and the goals."""
    runs = (
        "median of rounds 4 and 5 of one run"
        if quick
        else "median of rounds 4 and 5 of 3 runs (1 run at 10,000)"
    )
    return footnote(
        f"Steady-state rounds (of {ROUNDS}: the controller has fitted by round {STEADY_FROM}) "
        "of the aggregator's work through the ServerApp's exchange (plan, push, pull, decode, "
        "validate, aggregate, controller; the replies made by a stand-in SuperLink as they "
        f"are pulled, at most {PULL_BATCH} a pull) on a {params:,}-parameter model; this "
        f"process's wall clock on a shared 2-core machine, {runs}, sizes and modes "
        "alternated (round CPU: its CPU seconds, less affected by other processes' load, "
        "the same rounds); a round's peak memory: tracemalloc over one more round, untimed, of "
        "what it allocates on top of what the aggregator held as it began (the model is "
        f"{params * 4 / 2**20:.2f} MB of float32)",
        goals,
        virtual_clock=False,
    )


def _goals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    dense = [e for e in entries if e["mode"] == "none"]
    at = next(e for e in dense if e["devices"] == GOALS["devices"])
    small, large = dense[0], dense[-1]
    growth = (large["round_s"] / large["devices"]) / (dense[1]["round_s"] / dense[1]["devices"])
    model_kb = large["params"] * 4 / 1024
    # the slope between fleets that fill every pull (PULL_BATCH replies): what is left at the
    # largest fleet without it is the round's fixed memory (model-sized, replies in flight)
    full = next(e for e in dense if e["devices"] >= PULL_BATCH)
    per_device_kb = (
        (large["peak_mb"] - full["peak_mb"]) * 1024 / (large["devices"] - full["devices"])
    )
    fixed_mb = large["peak_mb"] - large["devices"] * per_device_kb / 1024
    met = {
        "round_s": at["round_s"] <= GOALS["round_s"],
        "linear": growth < 1.5,
        "memory": per_device_kb < 0.05 * model_kb,  # bookkeeping only, never a model copy
    }
    text = (
        f"1,000 devices <= 2 s per round: {at['round_s']:.2f} s "
        f"({verdict(met['round_s'])}; {at['cpu_s']:.2f} s of CPU); per-device cost at "
        f"{large['devices']:,} vs 100 devices: {growth:.2f}x "
        f"({'linear' if met['linear'] else 'NOT linear'}); a "
        f"round's peak memory {small['peak_mb']:.1f} MB at {small['devices']} devices, "
        f"{large['peak_mb']:.1f} MB at {large['devices']:,}: {per_device_kb:.1f} kB per device "
        f"(its plan, message and reply records; from {full['devices']:,} devices on, where every "
        f"pull is full) against a {model_kb:.0f} kB model, and {fixed_mb:.1f} MB without them "
        f"(model-sized buffers and at most {PULL_BATCH} frames in flight: "
        f"{'O(model)' if met['memory'] else 'NOT O(model)'})"
    )
    return {"met": met, "text": text, "per_device_kb": per_device_kb, "fixed_mb": fixed_mb}


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
