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
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aggregator.round_log import RoundRecord
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.plots import Panel, save_figure
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = [
    "HARNESS_KEYS",
    "HOLD",
    "RESULTS",
    "SEEDS",
    "SHORT_RUN",
    "VIRTUAL_CLOCK_NOTE",
    "FleetRun",
    "Panel",
    "Result",
    "StepCost",
    "changed_settings",
    "describe_settings",
    "every_seed",
    "flower_round_s",
    "footnote",
    "markdown_table",
    "mean_or_none",
    "measure_step_cost",
    "measured_code",
    "rounds_to_target",
    "run_fleet",
    "save_figure",
    "spread",
    "time_to_target",
    "verdict",
    "write_result",
]

#: The seeds every scenario's full run repeats over (its quick run takes the first).
SEEDS = (0, 1, 2)
#: The committed results (``fedstream bench`` writes here by default).
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
#: Run-config keys a benchmark sets to run and score a scenario, not to train differently:
#: how long, scored on what, with which seed, written where (:func:`changed_settings`
#: leaves them out of a row's settings; each table's footnote names them).
HARNESS_KEYS = (
    "num_rounds",
    "eval_data",
    "eval_samples",
    "seed",
    "checkpoint_dir",
    "out_dir",
)

VIRTUAL_CLOCK_NOTE = (
    "Times are on the in-process runner's virtual clock (per message: the model's download, "
    "wait, compute x slowdown and the update's upload, a round = its slowest device, then the "
    "aggregator's modelled aggregation and evaluation; the timing probe before round 1 "
    "charged as its own record), not wall time."
)

#: A short in-process run (RunSettings fields): a few steps on a small global batch, scored
#: on 500 held-out samples of the built-in task (the resume check; ``dev/fingerprint.py``).
SHORT_RUN: dict[str, Any] = {
    "local_steps": 5,
    "global_batch": 64,
    "b_min": 4,
    "b_max": 64,
    "eval_data": "synthetic",
    "eval_samples": 500,
}


@dataclass
class Result:
    """A scenario's output: JSON entries, a markdown table, and optional plots."""

    scenario: str
    entries: list[dict[str, Any]]
    table: str
    meta: dict[str, Any] = field(default_factory=dict)
    plots: list[Callable[[Path], Path]] = field(default_factory=list)
    #: Paths beyond this process's modules whose change can change the result: its data,
    #: and :data:`PROCESS_SOURCES` where it starts processes.
    sources: tuple[str, ...] = ()


@dataclass
class FleetRun:
    """What one in-process run produced."""

    records: list[RoundRecord]  # the ServerApp's rounds
    fill_log: list[dict[str, int]]  # per round: each buffer's fill before training
    buffers: dict[str, dict[str, Any]] = field(default_factory=dict)  # counters at the end


def run_fleet(
    label: str,
    devices: Sequence[VirtualDevice],
    settings: RunSettings,
    seed: int = 0,
    until_s: float | None = None,
    **grid_kw: Any,
) -> FleetRun:
    """Run the real ServerApp loop on a virtual fleet (``grid_kw``: InProcessGrid options);
    print ``label`` and the wall time it took, as progress.

    ``until_s`` ends the run at the first round that ends at or after that much virtual time
    (``num-rounds`` still bounds it).
    """
    torch.set_num_threads(1)  # deterministic and fair on a shared 2-core machine
    logging.getLogger("aggregator").setLevel(logging.WARNING)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedstream-bench-") as tmp:
        grid = InProcessGrid(devices, Path(tmp), settings, seed=seed, **grid_kw)
        stop = None if until_s is None else (lambda _: grid.clock >= until_s)
        try:
            run = FleetRun(run_rounds(grid, settings, stop), grid.fill_log, _stats(grid))
        finally:
            grid.close()
    print(f"  {label}: {time.monotonic() - started:.1f} s", flush=True)
    return run


@dataclass(frozen=True)
class StepCost:
    """What one SGD step of a model costs on this machine: the line fitted to the measured
    step times, and the measured spread around it.

    Attributes
    ----------
    a, c : float
        The fitted step time ``a + c * b`` seconds at batch ``b`` (intercept >= 0).
    table : dict of int to float
        The least disturbed (minimum) measured step time per batch size.
    sigma : float
        The measured noise: a robust standard deviation (1.4826 x the median absolute
        deviation) of the log of each step time over its batch size's median. Robust, so
        that steps another process on a shared host held up, which say something about the
        host and not about a device, do not set it.
    """

    a: float
    c: float
    table: dict[int, float]
    sigma: float

    def line(self, b: int) -> float:
        """The fitted step time at batch ``b`` (no noise)."""
        return self.a + self.c * b

    def noisy(self, seed: int) -> Callable[[int], float]:
        """Step times as the grid charges them: the line times a log-normal ratio of the
        measured spread (seeded), so the controller sees the timing noise a device shows
        rather than the exact line it fits."""
        rng = np.random.default_rng(seed)
        return lambda b: self.line(b) * float(np.exp(rng.normal(0.0, self.sigma)))

    def describe(self) -> str:
        """The fit and its noise in words, for a table's footnote."""
        return (
            f"t(b) = {self.a * 1e3:.3f} ms + {self.c * 1e6:.2f} us x b (fitted to the minimum "
            f"step time per batch size), times a log-normal ratio of the measured spread "
            f"(robust sigma of log(step time / its batch's median) = {self.sigma:.3f})"
        )


def measure_step_cost(
    model: torch.nn.Module,
    shape: Sequence[int],
    num_classes: int,
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    repeats: int = 40,
) -> StepCost:
    """Time SGD steps of ``model`` (one thread) at each batch size and fit the line.

    The line, not the raw table, is what is charged: the table has plateaus and jumps
    (caches, the timer's floor) that would make a comparison about this CPU. The first 5
    steps of each batch size warm up and are not kept.
    """
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    table: dict[int, float] = {}
    logs: list[float] = []
    for b in batches:
        x = torch.randn(b, *shape)
        y = torch.randint(0, num_classes, (b,))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        kept = np.array(times[5:])
        table[b] = float(kept.min())
        logs += list(np.log(kept / np.median(kept)))
    deviations = np.abs(np.array(logs) - np.median(logs))
    sigma = 1.4826 * float(np.median(deviations))
    c, a = np.polyfit(np.array(list(table)), np.array(list(table.values())), 1)
    return StepCost(max(float(a), 0.0), float(c), table, sigma)


def _stats(grid: InProcessGrid) -> dict[str, dict[str, Any]]:
    """Each device's buffer counters at the end of a run, and what its stream delivered."""
    return {
        grid.devices[node].device_id: {**store.stats(), "arrived": grid.streams[node].arrived}
        for node, store in grid.stores.items()
    }


#: Evaluations in a row at or above the target before a run counts as having reached it:
#: one evaluation that pokes above the target and falls back is noise, not convergence.
HOLD = 2


def time_to_target(records: Sequence[RoundRecord], target: float, hold: int = HOLD) -> float | None:
    """Virtual seconds until the held-out accuracy reaches ``target`` and stays there for
    ``hold`` evaluations in a row (the time of the first of them; None: never)."""
    clock, streak, first = 0.0, 0, 0.0
    for r in records:
        clock += r.virtual_s
        streak = streak + 1 if r.test_accuracy >= target else 0
        if streak == 1:
            first = clock
        if streak >= hold:
            return first
    return None


def rounds_to_target(records: Sequence[RoundRecord], target: float, hold: int = HOLD) -> int | None:
    """The first round of ``hold`` in a row whose held-out accuracy reaches ``target``."""
    streak = 0
    for r in records:
        streak = streak + 1 if r.test_accuracy >= target else 0
        if streak >= hold:
            return r.round - hold + 1
    return None


def spread(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    """``mean (min-max, n)`` of the seeds' values; a seed that never got one is named."""
    got = [v for v in values if v is not None]
    missing = len(values) - len(got)
    if not values:
        return "-"
    if not got:
        return f"none of {len(values)} seeds"
    text = fmt.format(statistics.mean(got))
    if len(got) > 1:
        dash = " to " if min(got) < 0 else "-"  # "-14-7" would read as a subtraction
        text += f" ({fmt.format(min(got))}{dash}{fmt.format(max(got))})"
    if missing:
        text += f", {missing} of {len(values)} seeds never"
    return text


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that exist (None when none does)."""
    got = [v for v in values if v is not None]
    return statistics.mean(got) if got else None


def changed_settings(
    settings: RunSettings, harness: Sequence[str] = HARNESS_KEYS
) -> dict[str, Any]:
    """The run-config keys (kebab-case) whose values in ``settings`` differ from the
    defaults, leaving out the ``harness`` keys: what a row changes from the product."""
    mine, defaults = settings.to_run_config(), RunSettings().to_run_config()
    skip = {kebab(k) for k in harness}
    return {k: v for k, v in mine.items() if k not in skip and v != defaults.get(k)}


def describe_settings(changed: dict[str, Any]) -> str:
    """A row's settings as its table cell: ``defaults``, or the keys it changes."""
    if not changed:
        return "defaults"
    return ", ".join(f"{k}={v}" for k, v in changed.items())


def every_seed(values: Sequence[float | None], ok: Callable[[float], bool]) -> bool:
    """The verdict rule of every goal stated over seeds: met only when each seed has a value
    and that value meets the goal (a seed that never got one misses it)."""
    return bool(values) and all(v is not None and ok(v) for v in values)


def flower_round_s(results: Path = RESULTS) -> tuple[float, str]:
    """The median round of plain Flower on its deployment engine as ``fedstream bench
    deployment`` last measured it (``plain-flower-tuned``: Flower's own FedAvg app, 4
    SuperNodes, this kind of machine), and where the figure comes from.

    Raises
    ------
    FileNotFoundError, KeyError
        If ``deployment.json`` or its plain-Flower entries are missing: the figure is
        measured, never typed in.
    """
    path = results / "deployment.json"
    doc = json.loads(path.read_text())
    medians = [
        e["round_wall_median_s"] for e in doc["entries"] if e["variant"] == "plain-flower-tuned"
    ]
    if not medians:
        raise KeyError(f"{path} holds no plain-flower-tuned run")
    value = float(statistics.median(medians))
    return value, (
        f"median round of plain Flower 1.42 (its FedAvg app, 4 SuperNodes) in "
        f"bench/results/deployment.json ({len(medians)} runs, {doc['created']})"
    )


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


#: What a benchmark that starts processes lists among its sources (``Result.sources``): its
#: SuperLink, SuperNodes, agents and ingest daemons load these in processes of their own,
#: which :func:`loaded_sources` cannot see (more than a result needs, never less).
PROCESS_SOURCES = ("aggregator/", "edge_client/", "deploy/")


def loaded_sources(extra: Sequence[str] = ()) -> list[str]:
    """The project's files this process has loaded (``aggregator/``, ``edge_client/``,
    ``deploy/`` but the command line), repository-relative, and ``extra``: the paths whose
    change can change a result made here (more than it needs, never less)."""
    root = Path(__file__).resolve().parents[2]
    found = set(extra)
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if not where:
            continue
        path = Path(where).resolve()
        if not path.is_relative_to(root):
            continue
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] in ("aggregator", "edge_client", "deploy") and not rel.startswith(
            "deploy/cli/"
        ):
            found.add(rel)
    return sorted(found)


def machine() -> dict[str, Any]:
    """Where a result was measured: cores, Python, torch and Flower."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": of("torch"),
        "flwr": of("flwr"),
    }


def measured_code(extra_sources: Sequence[str] = ()) -> dict[str, Any]:
    """What a result measured: the commit the benchmark ran (``commit``), whether the
    checkout had changes to tracked files beside it (``tree-clean``; both None outside a git
    checkout), the ``sources`` whose change invalidates it (:func:`loaded_sources`) and the
    ``machine``. ``dev/bench_results.py --check`` holds results to them."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit,
        "tree-clean": None if status is None else status == "",
        "sources": loaded_sources(extra_sources),
        "machine": machine(),
    }


def write_result(result: Result, out_dir: Path, json_path: Path | None = None) -> list[Path]:
    """Write ``<scenario>.json``, ``<scenario>.md`` and the plots; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "scenario": result.scenario,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **measured_code(result.sources),
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
