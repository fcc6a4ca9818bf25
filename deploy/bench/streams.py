"""ScaDLES' stream-rate effects: rate-aware training vs conventional synchronous SGD
(issue: paper effects, streams).

8 devices of equal speed whose stream rates are drawn from ScaDLES' sets S1, S2, S1p, S2p
(per device and seed). The *baseline* is conventional synchronous SGD on streams: a fixed
batch of 64 per device, each device waits until its batches have streamed in (``wait``, up
to the round deadline), buffers keep everything until consumed (``persistence``), no
availability cap. *ScaDLES*: the dynamic controller with the availability cap (no device is
asked for more than it can have: rate-aware batches), ``adapt`` (train on what is there,
never below b-min), ``truncation`` at one round's share, sample-weighted aggregation and the
learning rate scaled by sum(b)/B. Compute is charged from the step-time table measured at the
start (the line fitted in :mod:`deploy.bench.hetero`), waits at each stream's rate: all on the
virtual clock.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from deploy.bench.common import (
    FleetRun,
    Panel,
    Result,
    footnote,
    markdown_table,
    run_fleet,
    save_figure,
    time_to_target,
    verdict,
)
from deploy.bench.hetero import measure_step_time
from deploy.inprocess import VirtualDevice
from edge_client.emulation.constants import RATE_SETS
from edge_client.emulation.schedule import draw_rate
from edge_client.runtime.constants import POLICY_PERSISTENCE, POLICY_TRUNCATION
from edge_client.runtime.seeding import device_rng
from edge_client.wire.run_config import RunSettings

__all__ = ["run"]

DEVICES = 8
PER_DEVICE_BATCH = 64
LOCAL_STEPS = 20
TARGET_ACCURACY = 0.8
PERSISTENCE_CAP = 1_000_000  # the baseline's disk cap, in samples
TRUNCATION_CAP = PER_DEVICE_BATCH * LOCAL_STEPS  # one round's share
GOALS = {"speedup_S1p": 3.29, "accuracy_points": 0.01, "buffer_reduction": 100.0}


def rates(rate_set: str, seed: int) -> list[float]:
    return [draw_rate(rate_set, device_rng(seed, f"dev-{i}", 1)) for i in range(DEVICES)]


def run(quick: bool = False, seed: int = 0) -> Result:
    """Baseline and ScaDLES on each rate set."""
    step_time, _ = measure_step_time()
    base_rounds, scadles_rounds = (8, 80) if quick else (20, 300)
    runs: dict[tuple[str, str], FleetRun] = {}
    drawn: dict[str, list[float]] = {}
    for rate_set in RATE_SETS:
        drawn[rate_set] = rates(rate_set, seed)
        for method in ("baseline", "scadles"):
            scadles = method == "scadles"
            fleet = [
                VirtualDevice(
                    f"dev-{i}",
                    rate=r,
                    initial=0,
                    policy=POLICY_TRUNCATION if scadles else POLICY_PERSISTENCE,
                    capacity=TRUNCATION_CAP if scadles else PERSISTENCE_CAP,
                )
                for i, r in enumerate(drawn[rate_set])
            ]
            settings = RunSettings(
                num_rounds=scadles_rounds if scadles else base_rounds,
                local_steps=LOCAL_STEPS,
                global_batch=DEVICES * PER_DEVICE_BATCH,
                b_min=8,
                b_max=DEVICES * PER_DEVICE_BATCH,
                controller="dynamic" if scadles else "fixed",
                wait_policy="adapt" if scadles else "wait",
                availability_cap=scadles,
                eval_samples=2000,
                seed=seed,
            )
            label = f"streams {rate_set} {method}"
            runs[(rate_set, method)] = run_fleet(label, fleet, settings, seed, step_time=step_time)
    entries = _entries(runs, drawn)
    rows = [
        [
            e["rate_set"],
            e["method"],
            f"{e['rate_min']:.0f}-{e['rate_max']:.0f}",
            e["rounds"],
            _secs(e["time_to_target_s"]),
            f"{e['virtual_s']:.0f} s",
            f"{e['final_accuracy']:.3f}",
            f"{e['accuracy_at_common_s']:.3f} at {e['common_s']:.0f} s",
            f"{e['peak_buffer']:,}",
            f"{e['mean_buffer']:,.0f}",
            _x(e.get("speedup")),
            _x(e.get("buffer_reduction")),
        ]
        for e in entries
    ]
    table = markdown_table(
        [
            "rate set",
            "method",
            "rates/s",
            "rounds",
            f"time to {TARGET_ACCURACY:g}",
            "run length",
            "final accuracy",
            "accuracy at equal time",
            "peak buffer",
            "mean buffer",
            "speedup",
            "buffer reduction",
        ],
        rows,
    )
    goals = _goals(entries)
    table += footnote(
        f"{DEVICES} devices of equal speed, B={DEVICES * PER_DEVICE_BATCH}, {LOCAL_STEPS} "
        f"local steps, seed {seed}; baseline {base_rounds} rounds, ScaDLES {scadles_rounds} "
        "(its rounds are short). Buffers in samples, measured before each round's training, "
        "peak and mean over devices and rounds",
        goals["text"],
    )
    meta = {"quick": quick, "seed": seed, "rates": drawn, "goals": goals}
    return Result("streams", entries, table, meta, [lambda out: _plot(runs, out)])


def _entries(
    runs: dict[tuple[str, str], FleetRun], drawn: dict[str, list[float]]
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for (rate_set, method), out in runs.items():
        fills = [f for rnd in out.fill_log for f in rnd.values()]
        entries.append(
            {
                "rate_set": rate_set,
                "method": method,
                "rate_min": min(drawn[rate_set]),
                "rate_max": max(drawn[rate_set]),
                "rounds": len(out.records),
                "time_to_target_s": time_to_target(out.records, TARGET_ACCURACY),
                "virtual_s": sum(r.virtual_s for r in out.records),
                "final_accuracy": out.records[-1].accuracy,
                "peak_buffer": max(fills),
                "mean_buffer": statistics.mean(fills),
                "accuracy_curve": [r.accuracy for r in out.records],
            }
        )
    by = {(e["rate_set"], e["method"]): e for e in entries}
    for e in entries:
        if e["method"] == "scadles":
            b = by[(e["rate_set"], "baseline")]
            t_b, t_s = b["time_to_target_s"], e["time_to_target_s"]
            e["speedup"] = t_b / t_s if t_b and t_s else None
            e["buffer_reduction"] = b["peak_buffer"] / max(1, e["peak_buffer"])
            # Final accuracy compared at the same point on the virtual clock: the end of the
            # shorter of the two runs (each method's last evaluation by then).
            common = min(e["virtual_s"], b["virtual_s"])
            for x in (e, b):
                x["accuracy_at_common_s"] = _accuracy_at(runs[(x["rate_set"], x["method"])], common)
                x["common_s"] = common
            e["accuracy_delta"] = e["accuracy_at_common_s"] - b["accuracy_at_common_s"]
    return entries


def _accuracy_at(out: FleetRun, seconds: float) -> float:
    """The last evaluated accuracy at or before ``seconds`` of virtual time."""
    clock, acc = 0.0, 0.0
    for r in out.records:
        clock += r.virtual_s
        if clock > seconds + 1e-9:
            break
        acc = r.accuracy
    return acc


def _goals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    s1p = next(e for e in entries if e["rate_set"] == "S1p" and e["method"] == "scadles")
    speedup, delta = s1p.get("speedup"), s1p.get("accuracy_delta", -1.0)
    reduction = min(e["buffer_reduction"] for e in entries if e["method"] == "scadles")
    met = {
        "speedup": speedup is not None and speedup >= GOALS["speedup_S1p"],
        "accuracy": delta >= -GOALS["accuracy_points"],
        "buffer": reduction >= GOALS["buffer_reduction"],
    }
    text = (
        f"speedup >= 3.29x on S1p: {_x(speedup)} ({verdict(met['speedup'])}), "
        f"accuracy within 1 point (at equal virtual time): {delta * 100:+.1f} pt "
        f"({verdict(met['accuracy'])}); buffer reduction >= 100x with truncation (smallest "
        f"over the sets): {reduction:.0f}x ({verdict(met['buffer'])})"
    )
    return {"met": met, "text": text}


def _secs(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0f} s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _plot(runs: dict[tuple[str, str], FleetRun], out: Path) -> Path:
    def draw(axes: list[Axes]) -> None:
        for (rate_set, method), run_ in runs.items():
            clock = np.cumsum([r.virtual_s for r in run_.records])
            style = "--" if method == "baseline" else "-"
            label = f"{rate_set} {method}"
            axes[0].plot(clock, [r.accuracy for r in run_.records], style, label=label)
            axes[1].plot(clock, [max(f.values()) for f in run_.fill_log], style, label=label)

    panels = [
        Panel("virtual seconds", "accuracy", xscale="log"),
        Panel("virtual seconds", "largest buffer (samples)", xscale="log", yscale="log"),
    ]
    return save_figure(out / "streams.png", panels, draw)
