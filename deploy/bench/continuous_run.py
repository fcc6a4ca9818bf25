"""``fedstream bench service``: a continuous run (``num-rounds = 0``) for a day of virtual
time on the in-process runner; do memory and disk stay flat?

Two devices stream 1 sample/s each and train 5 steps at batch 8 per round, so a round waits
about 40 virtual seconds for fresh samples: a day is about 2,000 rounds (the quick form: 2
hours). Every round is checkpointed and logged, every 10th exported; the bounds are small so
that rotation happens many times: ``metrics-max-mb = 0.5`` with 2 rotated files,
``export-keep = 3``. Every 50 rounds the process's resident memory (``VmRSS``) and the bytes
on disk under the checkpoint, metrics, export and buffer directories are read.

Flat means: memory at the end within ``MEMORY_GROWTH`` of what it was after the first
tenth of the run (the model, torch and the buffers warmed up), and disk never above the
configured bounds plus the checkpoint and buffers' own size.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from aggregator.round_log import RoundRecord
from aggregator.server_app import run_rounds
from deploy.bench.common import Result, footnote, markdown_table, verdict
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.wire.run_config import RunSettings

__all__ = ["run", "samples_table"]

DAY_S, QUICK_S = 86_400.0, 7_200.0
SAMPLE_EVERY = 50
MEMORY_GROWTH = 0.10  # at most 10 % more resident memory at the end than after a tenth
METRICS_MB, METRICS_KEEP, EXPORT_KEEP = 0.5, 2, 3


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def run(quick: bool = False) -> Result:
    """A continuous run to a day (quick: 2 hours) of virtual time; samples of RSS and disk."""
    torch.set_num_threads(1)
    until = QUICK_S if quick else DAY_S
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-service-") as tmp:
        root = Path(tmp)
        dirs = {k: root / k for k in ("checkpoint", "metrics", "exports", "buffers")}
        settings = RunSettings(
            num_rounds=0,
            global_batch=16,
            b_min=4,
            local_steps=5,
            controller="fixed",
            controller_probe=0,
            wait_policy="wait",
            checkpoint_dir=str(dirs["checkpoint"]),
            out_dir=str(dirs["metrics"]),
            metrics_max_mb=METRICS_MB,
            metrics_keep=METRICS_KEEP,
            export_dir=str(dirs["exports"]),
            export_every=10,
            export_keep=EXPORT_KEEP,
            eval_data="",
        )
        devices = [VirtualDevice(f"dev-{i}", rate=1.0, initial=0) for i in range(2)]
        grid = InProcessGrid(devices, dirs["buffers"], settings)

        def stop(record: RoundRecord) -> bool:
            if record.round % SAMPLE_EVERY == 0 or grid.clock >= until:
                samples.append(
                    {
                        "round": record.round,
                        "virtual_h": round(grid.clock / 3600, 3),
                        "wall_s": round(time.monotonic() - started, 1),
                        "rss_mb": round(_rss_mb(), 1),
                        **{f"{k}_mb": round(_du_mb(d), 3) for k, d in dirs.items()},
                        "accuracy": record.accuracy,
                    }
                )
                print(f"  round {record.round}: {samples[-1]}", flush=True)
            return grid.clock >= until

        try:
            records = run_rounds(grid, settings, stop)
        finally:
            grid.close()
    base = samples[max(0, len(samples) // 10 - 1)]
    end = samples[-1]
    growth = end["rss_mb"] / base["rss_mb"] - 1
    limits = {
        "metrics_mb": METRICS_MB * (METRICS_KEEP + 1) + 0.1,
        "exports_mb": max(s["exports_mb"] for s in samples[:3]) * 2 + 0.1,
    }
    disk_ok = all(s[k] <= v for s in samples for k, v in limits.items())
    met = growth <= MEMORY_GROWTH and disk_ok
    table = samples_table(samples) + footnote(
        f"One continuous run, {len(records)} records kept in memory of {end['round']} rounds, "
        f"{end['wall_s']:.0f} s of wall time; memory is the whole process's (runner, "
        "ServerApp and ClientApps in one)",
        f"memory at the end within {MEMORY_GROWTH:.0%} of round {base['round']}'s "
        f"({growth:+.1%}) and disk within its bounds: {verdict(met)}",
    )
    return Result(
        "service",
        [{"samples": samples, "memory_growth": growth, "disk_limits_mb": limits}],
        table,
        meta={"quick": quick, "virtual_s": until},
    )


def samples_table(samples: Sequence[dict[str, Any]]) -> str:
    """The results table: about eight of a run's samples, evenly spaced, and its last.

    Parameters
    ----------
    samples : sequence of dict
        The run's samples of memory and disk (``samples`` of the entry in ``service.json``).

    Returns
    -------
    str
        Round, virtual hours, RSS and each folder's size, as a markdown table.
    """
    rows = [
        [
            s["round"],
            f"{s['virtual_h']:.1f}",
            f"{s['rss_mb']:.0f}",
            f"{s['checkpoint_mb']:.2f}",
            f"{s['metrics_mb']:.2f}",
            f"{s['exports_mb']:.2f}",
            f"{s['buffers_mb']:.2f}",
        ]
        for s in [*samples[:: max(1, len(samples) // 8)], samples[-1]]
    ]
    headers = ["round", "virtual hours", "RSS MB", "checkpoint MB", "metrics MB", "exports MB"]
    return markdown_table([*headers, "buffers MB"], rows)
