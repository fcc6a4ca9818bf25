"""``fedstream bench secagg``: what secure aggregation (SecAgg+) costs, beside plain
aggregation, on both of Flower's engines.

- ``scale``: fedstream's app on Flower's simulation engine (``flwr run`` on a
  ``--simulation`` SuperLink, :func:`deploy.bench.simulation.simulate`) with 10, 100 and
  1,000 virtual devices (``--quick``: 10 and 100), every device in every round, the synthetic
  task, fedstream's default 20 local steps; ``plain`` and ``secure`` one after the other.
  Per arm: seconds a round (median over the rounds after the first, which starts Ray), bytes
  up and down per device and round (the update frame or the keys, sealed shares and masked
  vector; the model and the stage messages down), the devices' CPU seconds on the three
  stages after training, the aggregator's CPU seconds unmasking, and the held-out accuracy.
- ``dropout``: 100 virtual devices, :data:`DROPOUT_ROUNDS` rounds, 10 % of the devices
  vanishing each round after sharing their keys, before their masked input
  (``sim-secagg-dropout``): their updates are not in the sum, and the aggregator must remove
  their pairwise masks from it with their shares, else the model is noise. Against plain
  aggregation with the same devices missing the same rounds (the same seeded draw); seeds
  0-2 (quick: seed 0). Goal: every round completes, and the final held-out accuracy is
  within a point of plain aggregation's.
- ``deployment``: 4 devices on Flower's deployment engine (a real SuperLink and SuperNodes,
  one ClientApp process per message), buffers filled before the run, ``plain`` and
  ``secure`` alternated :data:`REPETITIONS` times: each secure round is 4 exchanges, each
  stage message a process start on every device and Flower's polls.

Seconds are wall time on this 2-core machine (each arm runs alone); bytes and CPU seconds are
the runs' own ``metrics.jsonl`` figures.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from deploy.bench.common import (
    PROCESS_SOURCES,
    SEEDS,
    Result,
    footnote,
    markdown_table,
    mean_or_none,
    spread,
    verdict,
)
from deploy.bench.deployment import (
    _idle,
    _settings,
    fill_buffers,
    samples_for,
    standing_deployment,
)
from deploy.bench.simulation import simulate
from edge_client.wire.mapping import kebab

__all__ = ["ARMS", "run", "summary"]

SIZES, QUICK_SIZES = (10, 100, 1000), (10, 100)
SCALE_ROUNDS = {10: 5, 100: 5, 1000: 3}
SCALE_REPETITIONS = 2
DROPOUT_DEVICES, DROPOUT_ROUNDS, QUICK_DROPOUT_ROUNDS = 100, 10, 4
DROPOUT = 0.1
DEPLOYMENT_DEVICES, DEPLOYMENT_ROUNDS, REPETITIONS = 4, 5, 2
#: Goals: the overhead at 100 devices, and the accuracy under dropouts.
GOAL_RATIO, GOAL_POINTS = 2.0, 0.01
#: Rounds the final accuracy is averaged over.
SETTLED = 3
#: Extra exchanges a secure round makes (share keys, masked input, unmask).
EXTRA_EXCHANGES = 3
BASE: dict[str, Any] = {
    "sim-slowdowns": "1",  # emulated slowdowns sleep in Ray's actors: wall time, nothing else
    "eval-data": "synthetic",
    "eval-samples": 2000,
    "controller-probe": 0,
    kebab("local_steps"): 20,  # fedstream's default (simulate's own helper runs 5)
}
ARMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "secure": {"secure-aggregation": True},
}


def _per_round(records: Sequence[RoundRecord], devices: int) -> dict[str, Any]:
    """One run's figures per round, from its records (the first round left out of the
    seconds: it starts the engine's workers)."""
    later = records[1:] or records
    tests = [r.test_accuracy for r in records]
    up = [r.bytes_up / devices for r in records]  # a secure round's include its stages
    down = [(r.broadcast_bytes * r.planned_count + r.secagg_bytes_down) / devices for r in records]
    return {
        "rounds": len(records),
        "s_per_round": statistics.median(r.wall_s for r in later) if records else None,
        "secagg_s_per_round": statistics.median(r.timing.secagg_s for r in later)
        if records
        else None,
        "bytes_up_per_device": statistics.mean(up) if up else 0,
        "bytes_down_per_device": statistics.mean(down) if down else 0,
        "device_cpu_s": statistics.mean(r.secagg_device_cpu_s for r in records) if records else 0,
        "unmask_cpu_s": statistics.mean(r.secagg_unmask_s for r in records) if records else 0,
        "survivors": [r.secagg_survivors for r in records],
        "dropped": [r.secagg_dropped for r in records],
        "skipped": [r.skipped for r in records],
        "test_accuracy": tests,
        "final_accuracy": statistics.mean(tests[-SETTLED:]) if tests else None,
    }


def _simulated(
    devices: int, rounds: int, seed: int, keys: dict[str, Any], progress: Callable[[str], None]
) -> dict[str, Any]:
    """One simulation run; its figures."""
    where = Path(tempfile.mkdtemp(prefix="fedstream-bench-secagg-"))
    try:
        extra = {**BASE, **keys, "seed": seed}
        ran = simulate(devices, rounds, where, extra=extra, progress=lambda _line: None)
        records = rounds_only(read_metrics(where / "out" / "metrics.jsonl"))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    entry = {"status": ran["status"], "wall_s": ran["wall_s"], **_per_round(records, devices)}
    progress(
        f"    {entry['status']}: {entry['s_per_round']} s a round, "
        f"{entry['bytes_up_per_device'] / 1e3:.0f} kB up a device, accuracy "
        f"{entry['final_accuracy']}, survivors {entry['survivors']}"
    )
    return entry


def _scale(quick: bool, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Plain and secure runs at each size, alternated :data:`SCALE_REPETITIONS` times (once
    at 1,000 devices): each pair's ratio is taken within its repetition."""
    entries = []
    for devices in QUICK_SIZES if quick else SIZES:
        rounds = 3 if quick else SCALE_ROUNDS[devices]
        repetitions = 1 if quick or devices > DROPOUT_DEVICES else SCALE_REPETITIONS
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
        for rep in range(repetitions):
            for name, keys in ARMS.items():
                progress(f"  scale: {devices} devices, {name} {rep + 1}, {rounds} rounds")
                runs[name].append(_simulated(devices, rounds, 0, keys, progress))
        entries.append({"part": "scale", "devices": devices, "runs": runs})
    return entries


def _dropout(quick: bool, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rounds = QUICK_DROPOUT_ROUNDS if quick else DROPOUT_ROUNDS
    entries = []
    for seed in SEEDS[:1] if quick else SEEDS:
        arms = {}
        for name, keys in (
            ("plain", {"sim-secagg-dropout": DROPOUT}),  # the same devices send no update
            ("secure-dropout", {"secure-aggregation": True, "sim-secagg-dropout": DROPOUT}),
        ):
            progress(f"  dropout: seed {seed}, {name}, {DROPOUT_DEVICES} devices")
            arms[name] = _simulated(DROPOUT_DEVICES, rounds, seed, keys, progress)
        entries.append({"part": "dropout", "seed": seed, "arms": arms})
    return entries


def _deployed(quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """Plain and secure rounds alternated on a real SuperLink with 4 SuperNodes."""
    tmp = Path(tempfile.mkdtemp(prefix="fedstream-bench-secagg-deploy-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
    repetitions = 1 if quick else REPETITIONS
    try:
        plans = {
            f"{name}-{rep}": _settings(
                DEPLOYMENT_DEVICES,
                DEPLOYMENT_ROUNDS,
                tmp / "out" / f"{name}-{rep}",
                controller_probe=0,
                secure_aggregation=bool(keys),
            )
            for rep in range(repetitions)
            for name, keys in ARMS.items()
        }
        buffers = fill_buffers(tmp / "buffers", DEPLOYMENT_DEVICES, samples_for(*plans.values()))
        with standing_deployment(tmp / "flwr", buffers) as flower:
            for label, settings in plans.items():
                name = label.rsplit("-", 1)[0]
                progress(f"  deployment: {label}, {DEPLOYMENT_DEVICES} SuperNodes")
                started = time.monotonic()
                got = _idle(flower, label, settings)
                figures = _per_round(got.records, DEPLOYMENT_DEVICES)
                figures["total_s"] = round(time.monotonic() - started, 1)
                runs[name].append(figures)
                progress(
                    f"    {figures['s_per_round']} s a round, "
                    f"{figures['bytes_up_per_device'] / 1e3:.0f} kB up a device"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"part": "deployment", "devices": DEPLOYMENT_DEVICES, "runs": runs}


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """The three parts (``quick``: 10 and 100 devices, one dropout seed of 4 rounds, one
    deployment repetition)."""
    entries = [*_scale(quick, progress), *_dropout(quick, progress), _deployed(quick, progress)]
    return Result(
        "secagg",
        entries,
        _table(entries, quick),
        meta={
            "what": "fedstream's app on Flower's simulation and deployment engines, the "
            "synthetic task",
            "local_steps": BASE[kebab("local_steps")],
            "dropout": DROPOUT,
            # where the dropped devices vanish; the plain run misses the same devices
            "dropout_stage": "before-masked-input",
            "extra_exchanges": EXTRA_EXCHANGES,
            "summary": summary(entries),
            "quick": quick,
        },
        sources=PROCESS_SOURCES,
    )


def _ratio(secure: float | None, plain: float | None) -> float | None:
    return None if not secure or not plain else secure / plain


def _ratios(runs: dict[str, list[dict[str, Any]]]) -> list[float | None]:
    """Secure over plain seconds a round, repetition by repetition."""
    return [
        _ratio(s["s_per_round"], p["s_per_round"])
        for s, p in zip(runs["secure"], runs["plain"], strict=True)
    ]


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The goals' figures: secure over plain seconds a round at each size and on the
    deployment engine, and the dropout runs' accuracy gaps and completed rounds."""
    scale = {e["devices"]: _ratios(e["runs"]) for e in entries if e["part"] == "scale"}
    drops = [e for e in entries if e["part"] == "dropout"]
    runs = next(e for e in entries if e["part"] == "deployment")["runs"]
    lost = [d for e in drops for d in e["arms"]["secure-dropout"]["dropped"] if d is not None]
    return {
        "ratios_by_devices": scale,
        "ratio_100": mean_or_none(scale.get(DROPOUT_DEVICES, [])),
        "deployment_ratios": _ratios(runs),
        "dropout_gaps": [
            e["arms"]["plain"]["final_accuracy"] - e["arms"]["secure-dropout"]["final_accuracy"]
            for e in drops
        ],
        "dropout_completed": all(
            not any(e["arms"]["secure-dropout"]["skipped"])
            and e["arms"]["secure-dropout"]["rounds"] == len(e["arms"]["plain"]["test_accuracy"])
            for e in drops
        ),
        "dropout_lost": [min(lost, default=0), max(lost, default=0)],
        "dropout_seeds": [e["seed"] for e in drops],
    }


def _table(entries: list[dict[str, Any]], quick: bool) -> str:
    """The costs table, and the goals' verdicts."""
    rows = []
    for e in (e for e in entries if e["part"] == "scale"):
        rows.append(_row(f"simulation, {e['devices']:,}", e["runs"]["plain"], e["runs"]["secure"]))
    deployment = next(e for e in entries if e["part"] == "deployment")
    runs = deployment["runs"]
    rows.append(_row(f"deployment, {deployment['devices']}", runs["plain"], runs["secure"]))
    table = markdown_table(
        [
            "engine, devices",
            "plain s a round",
            "secure s a round (in stages 2-4)",
            "secure / plain",
            "kB up a device a round (plain / secure)",
            "kB down a device a round (plain / secure)",
            "device CPU ms, stages 2-4",
            "aggregator CPU s, unmasking",
            f"held-out accuracy, last {SETTLED} rounds (plain / secure)",
        ],
        rows,
    )
    got = summary(entries)
    ratio, gaps = got["ratio_100"], got["dropout_gaps"]
    low, high = got["dropout_lost"]
    lines = [
        table,
        "",
        f"Secure rounds make {EXTRA_EXCHANGES} more exchanges than plain ones. At "
        f"{DROPOUT_DEVICES} devices on the simulation engine: "
        + (
            "no ratio"
            if ratio is None
            else f"{ratio:.2f}x plain aggregation's round time, the mean of "
            f"{len(got['ratios_by_devices'][DROPOUT_DEVICES])} alternated pairs (goal <= "
            f"{GOAL_RATIO:g}x: "
            f"{verdict(max(got['ratios_by_devices'][DROPOUT_DEVICES]) <= GOAL_RATIO)}, "
            "in every pair)"
        )
        + ".",
        f"{DROPOUT_DEVICES} devices, {DROPOUT:.0%} vanishing before their masked input each "
        f"round ({low}-{high} lost a round, their masks removed), {len(gaps)} seed(s): every "
        f"round completed: {verdict(got['dropout_completed'])}; final accuracy "
        f"{spread(gaps, '{:+.3f}')} below plain aggregation with the same devices missing "
        f"(goal: within {GOAL_POINTS:.2f} in every seed: "
        f"{verdict(bool(gaps) and max(abs(g) for g in gaps) <= GOAL_POINTS)}).",
        footnote(
            "fedstream's app, the synthetic task, 20 local steps, every device in every round, "
            "seed 0 (the dropout runs: seeds 0-2); "
            "simulation: Flower's simulation engine (Ray, 2 workers); deployment: a real "
            f"SuperLink and {DEPLOYMENT_DEVICES} SuperNodes on this machine, buffers filled "
            "before the run; seconds a round are the median after the first round, wall "
            "time, each run alone" + (", quick run" if quick else ""),
            virtual_clock=False,
        ),
    ]
    return "\n".join(lines)


def _row(label: str, plain: list[dict[str, Any]], secure: list[dict[str, Any]]) -> list[str]:
    """A table row from the plain and secure runs of one setting (their spread when
    repeated)."""

    def of(runs: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
        return [r[key] * scale for r in runs if r[key] is not None]

    ratios = _ratios({"plain": plain, "secure": secure})
    return [
        label,
        spread(of(plain, "s_per_round"), "{:.2f}"),
        f"{spread(of(secure, 's_per_round'), '{:.2f}')} "
        f"({spread(of(secure, 'secagg_s_per_round'), '{:.2f}')})",
        spread(ratios, "{:.2f}x"),
        f"{spread(of(plain, 'bytes_up_per_device', 1e-3), '{:.0f}')} / "
        f"{spread(of(secure, 'bytes_up_per_device', 1e-3), '{:.0f}')}",
        f"{spread(of(plain, 'bytes_down_per_device', 1e-3), '{:.0f}')} / "
        f"{spread(of(secure, 'bytes_down_per_device', 1e-3), '{:.0f}')}",
        spread(of(secure, "device_cpu_s", 1e3), "{:.1f}"),
        spread(of(secure, "unmask_cpu_s"), "{:.2f}"),
        f"{spread(of(plain, 'final_accuracy'), '{:.3f}')} / "
        f"{spread(of(secure, 'final_accuracy'), '{:.3f}')}",
    ]
