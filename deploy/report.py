"""Run reports: summary.json and report.png from a run's rounds (``metrics.jsonl``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from aggregator.records import RoundRecord

__all__ = ["summarize", "write_report"]


def summarize(records: Sequence[RoundRecord], wall_s: float) -> dict[str, Any]:
    """Summary of a run: final accuracy, times, and per-device batch and compute series.

    ``virtual_s`` sums each round's slowest device (compute + wait + transfer): the
    synchronous round time on the virtual clock, whatever the wall clock did.
    """
    devices = sorted({d for r in records for d in r.devices})
    last = records[-1] if records else None
    return {
        "final_accuracy": last.accuracy if last else None,
        "rounds": len(records),
        "wall_s": round(wall_s, 2),
        "virtual_s": round(sum(r.virtual_s for r in records), 4),
        "accuracy": [r.accuracy for r in records],
        "bytes_up": sum(r.bytes_up for r in records),
        "broadcast_bytes_per_round": [r.broadcast_bytes for r in records],
        "compress_modes": [r.compress for r in records],
        "inject_bytes_per_round": [r.inject_bytes for r in records],
        "inject_bytes": sum(r.inject_bytes for r in records),
        "rejected": last.rejected if last else {},
        "rejected_reasons": last.rejected_reasons if last else {},
        "devices": {
            d: {
                "batch_size": [_of(r, d, "batch_size") for r in records],
                "compute_s": [_of(r, d, "compute_s") for r in records],
                "planned_batch": [r.planned.get(d) for r in records],
                "bytes_up": [_of(r, d, "bytes_up") for r in records],
            }
            for d in devices
        },
    }


def _of(record: RoundRecord, device: str, name: str) -> Any:
    """A device's reported value in a round (None when it did not reply)."""
    metrics = record.devices.get(device)
    return None if metrics is None else getattr(metrics, name)


def write_report(records: Sequence[RoundRecord], path: Path, title: str = "") -> None:
    """Plot accuracy vs time and per-device batch size and compute time per round."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rounds = [r.round for r in records]
    axes[0].plot([r.run_wall_s for r in records], [r.accuracy for r in records], marker="o")
    axes[0].set_xlabel("wall time (s)")
    axes[0].set_ylabel("accuracy (held-out stream)")
    axes[0].set_ylim(0, 1)
    for d in sorted({d for r in records for d in r.devices}):
        axes[1].plot(rounds, [_of(r, d, "batch_size") for r in records], marker=".", label=d)
        axes[2].plot(rounds, [_of(r, d, "compute_s") for r in records], marker=".", label=d)
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("batch size")
    axes[2].set_xlabel("round")
    axes[2].set_ylabel("compute time per round (s)")
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
