"""Run reports: summary.json and report.png from a run's metrics.jsonl."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

__all__ = ["read_metrics", "summarize", "write_report"]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-round records of a ``metrics.jsonl`` (missing file: none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(records: Sequence[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Summary of a run: final accuracy, times, and per-device batch and compute series.

    ``virtual_s`` sums each round's slowest device (compute + wait + transfer): the
    synchronous round time on the virtual clock, whatever the wall clock did.
    """
    devices = sorted({d for r in records for d in r["devices"]})
    return {
        "final_accuracy": records[-1]["accuracy"] if records else None,
        "rounds": len(records),
        "wall_s": round(wall_s, 2),
        "virtual_s": round(sum(r["virtual-s"] for r in records), 4),
        "accuracy": [r["accuracy"] for r in records],
        "bytes_up": sum(r.get("bytes-up", 0) for r in records),
        "broadcast_bytes_per_round": [r.get("broadcast-bytes", 0) for r in records],
        "compress_modes": [r.get("compress", "none") for r in records],
        "inject_bytes_per_round": [r.get("inject-bytes", 0) for r in records],
        "inject_bytes": sum(r.get("inject-bytes", 0) for r in records),
        "rejected": records[-1].get("rejected", {}) if records else {},
        "rejected_reasons": records[-1].get("rejected-reasons", {}) if records else {},
        "devices": {
            d: {
                "batch_size": [r["devices"].get(d, {}).get("batch") for r in records],
                "compute_s": [r["devices"].get(d, {}).get("compute-s") for r in records],
                "planned_batch": [r["planned"].get(d) for r in records],
                "bytes_up": [r["devices"].get(d, {}).get("bytes") for r in records],
            }
            for d in devices
        },
    }


def write_report(records: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """Plot accuracy vs time and per-device batch size and compute time per round."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rounds = [r["round"] for r in records]
    wall = [r.get("run-wall-s", 0.0) for r in records]
    axes[0].plot(wall, [r["accuracy"] for r in records], marker="o")
    axes[0].set_xlabel("wall time (s)")
    axes[0].set_ylabel("accuracy (held-out stream)")
    axes[0].set_ylim(0, 1)
    devices = sorted({d for r in records for d in r["devices"]})
    for d in devices:
        axes[1].plot(
            rounds, [r["devices"].get(d, {}).get("batch") for r in records], marker=".", label=d
        )
        axes[2].plot(
            rounds, [r["devices"].get(d, {}).get("compute-s") for r in records], marker=".", label=d
        )
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("batch size")
    axes[2].set_xlabel("round")
    axes[2].set_ylabel("compute time per round (s)")
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
