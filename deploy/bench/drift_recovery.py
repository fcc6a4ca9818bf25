"""``fedstream bench drift``: detecting a change in a device's stream, and recovering from it.

**The detector** (:class:`~edge_client.runtime.drift_watch.DriftWatch`, River's ADWIN at its
default ``delta = 0.002``) on a classifier's 0/1 prequential errors, per seed:

- false alarms: rises reported over 100,000 windows of a stationary stream, at error rates
  0.05, 0.1 and 0.2 (goal: at most one per 100,000);
- detection delay: windows from a change of the error rate (0.1 to 0.2, 0.3, 0.5) to its
  report.

**The fleet** (in-process runner, virtual clock): 4 devices learn the synthetic task for
``CHANGE_ROUND - 1`` rounds (the model reaches about 0.87), then the sensors of half the
fleet, or of all of it, are mounted the other way round (every value times -1: a gain
change). The devices watch their prequential errors (``drift = "adwin"`` in their node
config); the aggregator reacts as ``drift-reaction`` says, with ``drift-boost = 2`` for 3
rounds. Recovery: rounds from the change until the changed devices' prequential accuracy is
back within ``RECOVERY_MARGIN`` of its level before the change, two rounds in a row.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from deploy.bench.common import SEEDS, Result, footnote, markdown_table, run_fleet, spread, verdict
from deploy.inprocess import VirtualDevice
from edge_client.emulation.sources import SensorChange
from edge_client.runtime.drift_watch import DEFAULT_DELTA, DriftWatch
from edge_client.wire.run_config import RunSettings

__all__ = ["detector_delays", "false_alarms", "recovery_rounds", "results_tables", "run"]

STATIONARY = 100_000
ERROR_RATES = (0.05, 0.1, 0.2)
CHANGES = ((0.1, 0.2), (0.1, 0.3), (0.1, 0.5))
DEVICES, B, K = 4, 128, 20
CHANGE_ROUND, ROUNDS, QUICK_ROUNDS = 14, 26, 20
RECOVERY_MARGIN = 0.05
REACTIONS = ("none", "learning-rate", "boost")
GOAL_FALSE_ALARMS = 1  # per 100,000 stationary windows
GOAL_DELAY = 300  # windows, for an error rate that triples


def _errors(rate: float, n: int, rng: np.random.Generator) -> list[float]:
    return [float(v) for v in rng.random(n) < rate]


def false_alarms(rate: float, seed: int, n: int = STATIONARY) -> int:
    """Rises ADWIN reports on ``n`` stationary 0/1 errors at ``rate``."""
    return len(DriftWatch(DEFAULT_DELTA).update(_errors(rate, n, np.random.default_rng(seed))))


def detector_delays(before: float, after: float, seed: int) -> int | None:
    """Windows from a change of the error rate to its report (None: not within 5,000)."""
    rng = np.random.default_rng(seed)
    watch = DriftWatch(DEFAULT_DELTA)
    watch.update(_errors(before, 10_000, rng))
    found = watch.update(_errors(after, 5_000, rng))
    return found[0] if found else None


def recovery_rounds(curve: list[float], change_round: int, hold: int = 2) -> int | None:
    """Rounds after ``change_round`` until the accuracy is back within
    :data:`RECOVERY_MARGIN` of its mean over the 3 rounds before, ``hold`` rounds in a row."""
    level = statistics.mean(curve[change_round - 4 : change_round - 1])
    streak = 0
    for i in range(change_round - 1, len(curve)):
        streak = streak + 1 if curve[i] >= level - RECOVERY_MARGIN else 0
        if streak >= hold:
            return i - hold + 2 - change_round
    return None


def _fleet_run(changed: int, reaction: str, seed: int, rounds: int) -> dict[str, Any]:
    per_device = B // DEVICES * K
    devices = [
        VirtualDevice(
            f"dev-{i}",
            rate=math.inf,
            initial=0,
            drift="adwin",
            change=SensorChange(after=per_device * (CHANGE_ROUND - 1), gain=-1.0)
            if i < changed
            else None,
        )
        for i in range(DEVICES)
    ]
    settings = RunSettings(
        num_rounds=rounds,
        local_steps=K,
        global_batch=B,
        controller="fixed",
        controller_probe=0,
        drift_reaction=reaction,
        drift_boost=2.0,
        drift_rounds=3,
        eval_data="",
        seed=seed,
    )
    records = run_fleet(
        f"{changed} changed, {reaction}, seed {seed}", devices, settings, seed
    ).records
    moved = [f"dev-{i}" for i in range(changed)]
    curve = [statistics.mean(r.devices[d].eval_metric for d in moved) for r in records]
    after = curve[CHANGE_ROUND - 1 :]
    return {
        "changed": changed,
        "reaction": reaction,
        "seed": seed,
        "accuracy_changed_devices": curve,
        "accuracy_all": [r.accuracy for r in records],
        "recovery_rounds": recovery_rounds(curve, CHANGE_ROUND),
        "mean_after_change": statistics.mean(after),
        "detected": {r.round: r.drift for r in records if r.drift},
        "virtual_s": [r.virtual_s for r in records],
    }


def run(quick: bool = False) -> Result:
    """The detector's false alarms and delays, then the fleet's recovery per reaction."""
    seeds = SEEDS[:1] if quick else SEEDS
    entries: list[dict[str, Any]] = []
    alarms = {rate: [false_alarms(rate, s) for s in seeds] for rate in ERROR_RATES}
    delays = {c: [detector_delays(*c, s) for s in seeds] for c in CHANGES}
    entries.append(
        {
            "detector": f"ADWIN delta={DEFAULT_DELTA}",
            "false_alarms_per_100k": {str(k): v for k, v in alarms.items()},
            "delay_windows": {f"{a}->{b}": v for (a, b), v in delays.items()},
        }
    )
    rounds = QUICK_ROUNDS if quick else ROUNDS
    scenarios = [(DEVICES // 2, r) for r in (("none", "learning-rate") if quick else REACTIONS)]
    if not quick:
        scenarios += [(DEVICES, r) for r in REACTIONS]
    fleet = [_fleet_run(c, r, s, rounds) for c, r in scenarios for s in seeds]
    entries += fleet
    worst_alarms = max(max(v) for v in alarms.values())
    tripled = [d for d in delays[(0.1, 0.3)] if d is not None]
    met_alarms = worst_alarms <= GOAL_FALSE_ALARMS
    met_delay = len(tripled) == len(seeds) and max(tripled) <= GOAL_DELAY
    table = results_tables(entries) + footnote(
        f"Detector: {len(seeds)} seed(s), {STATIONARY:,} windows per stationary stream. Fleet: "
        f"{DEVICES} devices, B={B}, K={K}, fixed batches, {rounds} rounds, sensors flipped "
        f"(gain -1) from round {CHANGE_ROUND}; recovery: back within {RECOVERY_MARGIN} of the "
        "accuracy before, 2 rounds in a row",
        f"at most {GOAL_FALSE_ALARMS} false alarm per 100k windows: {verdict(met_alarms)}; "
        f"0.1 -> 0.3 detected within {GOAL_DELAY} windows: {verdict(met_delay)}",
    )
    return Result("drift", entries, table, meta={"quick": quick, "seeds": list(seeds)})


def results_tables(entries: Sequence[dict[str, Any]]) -> str:
    """The results tables: the detector's false alarms and delays, then the fleet's recovery
    per scenario (the mean and spread over its seeds).

    Parameters
    ----------
    entries : sequence of dict
        :func:`run`'s entries (as in ``drift.json``): the detector's, then one per fleet run.

    Returns
    -------
    str
        The two markdown tables.
    """
    rows = []
    for e in (e for e in entries if "detector" in e):
        for rate, v in e["false_alarms_per_100k"].items():
            rows.append(
                [f"error rate {rate}, stationary", f"{statistics.mean(v):.2f} (max {max(v)})", "-"]
            )
        for change, v in e["delay_windows"].items():
            before, after = change.split("->")
            rows.append([f"error rate {before} -> {after}", "-", spread(v, "{:.0f}")])
    table = markdown_table(
        ["detector (ADWIN, 0/1 errors)", "false alarms per 100k", "delay, windows"], rows
    )
    fleet = [e for e in entries if "changed" in e]
    fleet_rows = []
    for changed, reaction in dict.fromkeys((e["changed"], e["reaction"]) for e in fleet):
        runs = [e for e in fleet if e["changed"] == changed and e["reaction"] == reaction]
        fleet_rows.append(
            [
                f"{changed} of {DEVICES}",
                reaction,
                spread([e["recovery_rounds"] for e in runs], "{:.1f}"),
                spread([e["mean_after_change"] for e in runs], "{:.3f}"),
                spread([len(e["detected"]) for e in runs], "{:.1f}"),
            ]
        )
    headers = ["sensors flipped", "drift-reaction", "rounds to recover"]
    headers += ["changed devices' accuracy after the change (mean)", "rounds with a detection"]
    return table + "\n\n" + markdown_table(headers, fleet_rows)
