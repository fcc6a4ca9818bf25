"""What every benchmark scenario shares: the in-process fleet runner, the result files, and
the figures' helpers (:mod:`deploy.plots`, re-exported here for the scenarios).

Scenarios run the real ServerApp loop and ClientApp on :class:`deploy.inprocess.InProcessGrid`:
times they report are on its *virtual clock* (each device charged
``compute * slowdown + wait + bytes / bandwidth``, a round = its slowest device), and
every table says so.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aggregator.records import RoundRecord
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.plots import Panel, save_figure
from edge_client.wire.run_config import RunSettings

__all__ = [
    "VIRTUAL_CLOCK_NOTE",
    "FleetRun",
    "Panel",
    "Result",
    "footnote",
    "markdown_table",
    "rounds_to_target",
    "run_fleet",
    "save_figure",
    "time_to_target",
    "verdict",
    "write_result",
]

VIRTUAL_CLOCK_NOTE = (
    "Times are on the in-process runner's virtual clock (compute x slowdown + wait + "
    "bytes/bandwidth, a round = its slowest device), not wall time."
)


@dataclass
class Result:
    """A scenario's output: JSON entries, a markdown table, and optional plots."""

    scenario: str
    entries: list[dict[str, Any]]
    table: str
    meta: dict[str, Any] = field(default_factory=dict)
    plots: list[Callable[[Path], Path]] = field(default_factory=list)


@dataclass
class FleetRun:
    """What one in-process run produced."""

    records: list[RoundRecord]  # the ServerApp's rounds
    fill_log: list[dict[str, int]]  # per round: each buffer's fill before training


def run_fleet(
    label: str,
    devices: Sequence[VirtualDevice],
    settings: RunSettings,
    seed: int = 0,
    **grid_kw: Any,
) -> FleetRun:
    """Run the real ServerApp loop on a virtual fleet (``grid_kw``: InProcessGrid options);
    print ``label`` and the wall time it took, as progress."""
    torch.set_num_threads(1)  # deterministic and fair on a shared 2-core machine
    logging.getLogger("aggregator").setLevel(logging.WARNING)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-") as tmp:
        grid = InProcessGrid(devices, Path(tmp), settings, seed=seed, **grid_kw)
        try:
            run = FleetRun(run_rounds(grid, settings), grid.fill_log)
        finally:
            grid.close()
    print(f"  {label}: {time.monotonic() - started:.1f} s", flush=True)
    return run


def time_to_target(records: Sequence[RoundRecord], target: float) -> float | None:
    """Virtual seconds until the held-out accuracy first reaches ``target`` (None: never)."""
    clock = 0.0
    for r in records:
        clock += r.virtual_s
        if r.accuracy >= target:
            return clock
    return None


def rounds_to_target(records: Sequence[RoundRecord], target: float) -> int | None:
    """The first round whose held-out accuracy reaches ``target`` (None: never)."""
    return next((r.round for r in records if r.accuracy >= target), None)


def footnote(setup: str, goals: str | None = None, virtual_clock: bool = True) -> str:
    """The text under a results table: the setup, the goals and their verdicts, and (for the
    in-process runner's results) where the times come from."""
    parts = [setup.rstrip(". ") + "."]
    if goals:
        parts.append(f"Goals: {goals}.")
    if virtual_clock:
        parts.append(VIRTUAL_CLOCK_NOTE)
    return "\n\n" + " ".join(parts)


def verdict(met: bool) -> str:
    """How a goal is reported: ``met`` or ``MISSED``."""
    return "met" if met else "MISSED"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_result(result: Result, out_dir: Path, json_path: Path | None = None) -> list[Path]:
    """Write ``<scenario>.json``, ``<scenario>.md`` and the plots; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "scenario": result.scenario,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **result.meta,
        "entries": result.entries,
    }
    paths = []
    for path in {out_dir / f"{result.scenario}.json", *([json_path] if json_path else [])}:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        paths.append(path)
    md = out_dir / f"{result.scenario}.md"
    md.write_text(f"# {result.scenario}\n\n{result.table}\n")
    paths.append(md)
    paths += [plot(out_dir) for plot in result.plots]
    return paths
