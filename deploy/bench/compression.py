"""Compressed updates side by side: bytes up, accuracy, codec speed (issue: update codec).

Every mode trains the same task (4 devices, slowdowns 1/1/2/4, the default CNN) for the
same rounds from the same seeds with the ``fixed`` controller, so that the codec is the only
difference; bytes up are the frames the aggregator received. Encode/decode speed is timed
separately on a 1M-value float32 delta (median of 5).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from aggregator.records import RoundRecord
from deploy.bench.common import (
    Panel,
    Result,
    footnote,
    markdown_table,
    rounds_to_target,
    run_fleet,
    save_figure,
    verdict,
)
from deploy.inprocess import VirtualDevice
from edge_client.wire.codec import decode, encode
from edge_client.wire.run_config import RunSettings

__all__ = ["CASES", "codec_speed", "run"]

# label -> run-config overrides (RunSettings field names)
CASES: dict[str, dict[str, Any]] = {
    "none": {"compress": "none"},
    "fp16": {"compress": "fp16"},
    "int8": {"compress": "int8"},
    "topk-10%": {"compress": "topk", "compress_ratio": 0.1},
    "topk-1%": {"compress": "topk", "compress_ratio": 0.01},
    "adaptive-10%": {"compress": "adaptive", "compress_ratio": 0.1},
    "adaptive-1%": {"compress": "adaptive", "compress_ratio": 0.01},
    "int8+fp16-down": {"compress": "int8", "compress_broadcast": "fp16"},
}
# label -> (minimum bytes ratio vs none, largest accuracy drop allowed)
GOALS = {"topk-1%": (50.0, 0.01), "int8": (3.5, 0.005)}
SPEED_GOAL_MBPS = 100.0
SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
TARGET_ACCURACY = 0.9


def codec_speed(
    mode: str, ratio: float, values: int = 1_000_000, reps: int = 5
) -> dict[str, float]:
    """Median encode, decode and encode+decode MB/s of float32 input for one mode."""
    rng = np.random.default_rng(0)
    delta = {"w": (rng.standard_normal(values) * 0.01).astype(np.float32)}
    mb = values * 4 / 1e6
    enc, dec = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        frame = encode(delta, mode, ratio)
        t1 = time.perf_counter()
        decode(frame)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    e, d = statistics.median(enc), statistics.median(dec)
    return {"encode_mbps": mb / e, "decode_mbps": mb / d, "roundtrip_mbps": mb / (e + d)}


def run(quick: bool = False, seed: int = 0) -> Result:
    """Train once per case; compare with ``none``."""
    # Sparse updates converge later, not lower: compare once training has settled.
    rounds = 15 if quick else 100
    base: dict[str, Any] = {
        "num_rounds": rounds,
        "local_steps": 20,
        "global_batch": 128,
        "controller": "fixed",
        "eval_samples": 2000,
        "seed": seed,
    }
    fleet = [
        VirtualDevice(f"dev-{i}", slowdown=s, rate=5000.0, initial=4000)
        for i, s in enumerate(SLOWDOWNS)
    ]
    runs: dict[str, list[RoundRecord]] = {}
    for label, overrides in CASES.items():
        settings = RunSettings(**base, **overrides)
        runs[label] = run_fleet(f"compression {label}", fleet, settings, seed).records
    ref_bytes = sum(r.bytes_up for r in runs["none"])
    ref_acc = runs["none"][-1].accuracy
    entries = []
    for label, records in runs.items():
        case = CASES[label]
        mode = case["compress"]
        ratio = float(case.get("compress_ratio", 0.1))
        bytes_up = sum(r.bytes_up for r in records)
        acc = records[-1].accuracy
        speed = codec_speed("topk" if mode == "adaptive" else mode, ratio)
        entry: dict[str, Any] = {
            "mode": label,
            "codec": mode,
            "compress_ratio": ratio if mode in ("topk", "adaptive") else None,
            "broadcast": case.get("compress_broadcast", "none"),
            "rounds": len(records),
            "bytes_up": bytes_up,
            "broadcast_bytes": sum(r.broadcast_bytes for r in records),
            "ratio": ref_bytes / bytes_up,
            "final_accuracy": acc,
            "accuracy_delta": acc - ref_acc,
            "final_accuracy_last5": float(np.mean([r.accuracy for r in records[-5:]])),
            "rounds_to_target": rounds_to_target(records, TARGET_ACCURACY),
            "topk_rounds": sum(r.compress == "topk" for r in records),
            "accuracy_curve": [r.accuracy for r in records],
            **{k: round(v, 1) for k, v in speed.items()},
        }
        goal = GOALS.get(label)
        entry["goal"] = f">= {goal[0]:g}x, accuracy within {goal[1] * 100:g} pt" if goal else None
        entry["goal_met"] = (
            entry["ratio"] >= goal[0] and entry["accuracy_delta"] >= -goal[1] if goal else None
        )
        entry["speed_goal_met"] = entry["roundtrip_mbps"] >= SPEED_GOAL_MBPS
        entries.append(entry)
    rows = [
        [
            e["mode"],
            f"{e['bytes_up']:,}",
            f"{e['ratio']:.1f}x",
            f"{e['broadcast_bytes']:,}",
            f"{e['final_accuracy']:.3f}",
            f"{e['accuracy_delta'] * 100:+.1f} pt",
            f"{e['final_accuracy_last5']:.3f}",
            e["rounds_to_target"] or f"> {e['rounds']}",
            e["topk_rounds"],
            f"{e['encode_mbps']:.0f} / {e['decode_mbps']:.0f} / {e['roundtrip_mbps']:.0f}",
            _goal_text(e),
        ]
        for e in entries
    ]
    table = markdown_table(
        [
            "mode",
            "bytes up",
            "vs none",
            "bytes down",
            "final accuracy",
            "vs none",
            "mean of last 5",
            f"rounds to {TARGET_ACCURACY:g}",
            "top-k rounds",
            "enc / dec / both MB/s",
            "goal",
        ],
        rows,
    )
    table += footnote(
        f"{rounds} rounds x 20 local steps, 4 devices (slowdowns 1/1/2/4), B=128, fixed "
        f"controller, seed {seed}; bytes are codec frames as received. Speeds: 1M float32 "
        f"values, median of 5, goal >= {SPEED_GOAL_MBPS:.0f} MB/s encode+decode"
    )
    meta = {"rounds": rounds, "quick": quick, "seed": seed}
    return Result("compression", entries, table, meta, [lambda out: _plot(runs, out)])


def _goal_text(e: dict[str, Any]) -> str:
    if e["goal"] is None:
        return "-"
    return f"{e['goal']}: {verdict(e['goal_met'])}"


def _plot(runs: dict[str, list[RoundRecord]], out: Path) -> Path:
    def draw(axes: list[Axes]) -> None:
        for label, records in runs.items():
            cum = np.cumsum([r.bytes_up for r in records])
            acc = [r.accuracy for r in records]
            axes[0].plot([r.round for r in records], acc, label=label)
            axes[1].plot(cum / 1e3, acc, label=label)

    panels = [Panel("round", "accuracy"), Panel("cumulative kB up", "accuracy", xscale="log")]
    return save_figure(out / "compression.png", panels, draw)
