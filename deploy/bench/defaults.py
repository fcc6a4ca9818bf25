"""What chose the run config's defaults: each controller and aggregation default against its
alternatives, side by side on the virtual clock (issue: the controller wins at the defaults).

Two starting points, each varied one key at a time:

* **old defaults** (the release before this one: B = 128, b-max = 256, ``fednova``,
  ``controller-probe`` 3, the learning rate scaled by ``sum(b) / B`` under a stream cap),
  where the fixed split reached the target as soon as or sooner than the controller: what
  each change to them alone does;
* **defaults** (this release's): what each default gives against its alternatives
  (aggregation rule, probe, global batch, deadband, smoothing, controller period, learning
  rate), everything else at the defaults.

Scenarios, 4 devices, as in :mod:`deploy.bench.hetero` (its step-time line, measured at the
start, times measured noise, times each device's slowdown): HL2, HL4, HL8 and one device
10x slower, on streams that never limit a batch (target 0.85); HL8 with one of 4 classes
per device (label skew, target 0.5, twice the rounds); and 4 equal devices on ScaDLES' S2
stream rates (the streams limit the batches, target 0.85, 40 rounds). Each arm's time to
target is from virtual time 0 (the probe charged) and its reduction is against the fixed
split at the same starting point and seed; steady = the mean round time after round 3.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from aggregator.round_log import RoundRecord, rounds_only
from deploy.bench import common
from deploy.bench.hetero import measure_step_time, slowdowns
from deploy.inprocess import VirtualDevice
from edge_client.emulation.schedule import draw_rate
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.seeding import device_rng
from edge_client.wire.run_config import RunSettings

__all__ = ["ARMS", "OLD_DEFAULTS", "run"]

#: The previous release's controller and aggregation defaults (RunSettings field names).
OLD_DEFAULTS: dict[str, Any] = {
    "global_batch": 128,
    "b_max": 256,
    "lr_batch": 0,
    "aggregation": "fednova",
    "controller_probe": 3,
}
#: Arm -> (starting point, what it changes): ``old`` arms change the old defaults, the
#: others this release's. ``fixed`` arms are the equal split the others are judged against.
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "old fixed": ("old", {"controller": "fixed"}),
    "old dynamic": ("old", {}),
    "old + adaptive": ("old", {"aggregation": "adaptive"}),
    "old + fedavg": ("old", {"aggregation": "fedavg"}),
    "old + probe 1": ("old", {"controller_probe": 1}),
    "old + probe 0": ("old", {"controller_probe": 0}),
    "old + B 512": ("old", {"global_batch": 512, "b_max": 512, "lr_batch": 128}),
    "fixed": ("new", {"controller": "fixed"}),
    "dynamic": ("new", {}),
    "fednova": ("new", {"aggregation": "fednova"}),
    "fedavg": ("new", {"aggregation": "fedavg"}),
    "probe 0": ("new", {"controller_probe": 0}),
    "probe 3": ("new", {"controller_probe": 3}),
    "deadband 0.02": ("new", {"deadband": 0.02}),
    "deadband 0.1": ("new", {"deadband": 0.1}),
    "smoothing 0.3": ("new", {"controller_smoothing": 0.3}),
    "smoothing 0.8": ("new", {"controller_smoothing": 0.8}),
    "period 2": ("new", {"controller_period": 2}),
    "lr 0.1": ("new", dict(lr=0.1)),
    "fixed lr 0.1": ("new", dict(controller="fixed", lr=0.1)),
    "lr-batch 0": ("new", {"lr_batch": 0}),
}
IID_SCENARIOS = ("HL2", "HL4", "HL8", "straggler")
IID_ARMS = tuple(a for a in ARMS if a not in ("lr 0.1", "fixed lr 0.1", "lr-batch 0"))
SKEW_ARMS = (
    "old fixed",
    "old dynamic",
    "old + fedavg",
    "fixed",
    "dynamic",
    "fednova",
    "fedavg",
    "lr 0.1",
    "fixed lr 0.1",
)
STREAM_ARMS = ("old fixed", "old dynamic", "old + B 512", "fixed", "dynamic", "lr-batch 0")
TARGETS = {"skew-HL8": 0.5}  # the rest: TARGET
TARGET = 0.85
ROUNDS = {"skew-HL8": 50, "streams-S2": 40}  # the rest: IID_ROUNDS
IID_ROUNDS = 25
SKEW_CLASSES = 4
EVAL_SAMPLES = 1000


def settings(arm: str, rounds: int, seed: int, **extra: Any) -> RunSettings:
    """An arm's run config: its starting point, its change, the benchmark's harness keys."""
    start, change = ARMS[arm]
    base = OLD_DEFAULTS if start == "old" else {}
    return RunSettings(
        **{**base, **change, **extra},
        num_rounds=rounds,
        eval_data="synthetic",
        eval_samples=EVAL_SAMPLES,
        seed=seed,
    )


def fleet(scenario: str, seed: int) -> list[VirtualDevice]:
    """The scenario's four devices."""
    if scenario == "streams-S2":
        return [
            VirtualDevice(f"dev-{i}", rate=draw_rate("S2", device_rng(seed, f"dev-{i}", 1)))
            for i in range(4)
        ]
    level = "HL8" if scenario == "skew-HL8" else scenario
    return [
        VirtualDevice(
            f"dev-{i}",
            slowdown=s,
            rate=math.inf,
            initial=0,
            labels=pick_classes(1, SKEW_CLASSES, index=i) if scenario == "skew-HL8" else None,
        )
        for i, s in enumerate(slowdowns(level))
    ]


def _arms(scenario: str) -> Sequence[str]:
    return {"skew-HL8": SKEW_ARMS, "streams-S2": STREAM_ARMS}.get(scenario, IID_ARMS)


def run(quick: bool = False) -> common.Result:
    """Every scenario x arm over :data:`~deploy.bench.common.SEEDS` (the first with
    ``quick``)."""
    seeds = common.SEEDS[:1] if quick else common.SEEDS
    cost = measure_step_time()
    runs: dict[tuple[str, str, int], list[RoundRecord]] = {}
    for seed in seeds:
        for scenario in (*IID_SCENARIOS, "skew-HL8", "streams-S2"):
            extra = {"num_classes": SKEW_CLASSES} if scenario == "skew-HL8" else {}
            for arm in _arms(scenario):
                s = settings(arm, ROUNDS.get(scenario, IID_ROUNDS), seed, **extra)
                runs[(scenario, arm, seed)] = common.run_fleet(
                    f"defaults {scenario} {arm} seed {seed}",
                    fleet(scenario, seed),
                    s,
                    seed,
                    step_time=cost.noisy(seed),
                ).records
    entries = _entries(runs, seeds)
    table = _table(entries) + common.footnote(
        f"4 devices; seeds {', '.join(map(str, seeds))}, each figure the mean (min-max) over "
        "them. 'old' arms start from the previous release's defaults ("
        + ", ".join(f"{k.replace('_', '-')} = {v}" for k, v in OLD_DEFAULTS.items())
        + "), the others from this release's; each row's settings column names every key it "
        "changes from this release's defaults (the benchmark also sets num-rounds: "
        f"{IID_ROUNDS}, skew {ROUNDS['skew-HL8']}, streams {ROUNDS['streams-S2']}; eval-data, "
        f"{EVAL_SAMPLES} held-out samples; and the seed). Targets {TARGET:g} (label skew "
        f"{TARGETS['skew-HL8']:g}), held for two evaluations; reduction = 1 - time(arm) / "
        "time(the fixed split at the same starting point), per seed; steady = mean round time "
        f"after round 3; final = the mean of the last 5 evaluations. Compute: {cost.describe()}",
    )
    return common.Result(
        "defaults",
        entries,
        table,
        meta={
            "quick": quick,
            "seeds": list(seeds),
            "old-defaults": {k.replace("_", "-"): v for k, v in OLD_DEFAULTS.items()},
            "step-cost": {"a": cost.a, "c": cost.c, "sigma": cost.sigma},
        },
    )


def _entries(
    runs: dict[tuple[str, str, int], list[RoundRecord]], seeds: Sequence[int]
) -> list[dict[str, Any]]:
    entries = []
    for scenario, arm in dict.fromkeys((sc, arm) for sc, arm, _ in runs):
        target = TARGETS.get(scenario, TARGET)
        start = ARMS[arm][0]
        fixed_arm = "old fixed" if start == "old" else "fixed"
        if arm == "lr 0.1":
            fixed_arm = "fixed lr 0.1"
        per: dict[str, list[Any]] = {k: [] for k in ("ttt", "reduction", "steady", "final")}
        for seed in seeds:
            records = runs[(scenario, arm, seed)]
            ttt = common.time_to_target(records, target)
            fixed = common.time_to_target(runs[(scenario, fixed_arm, seed)], target)
            rounds = rounds_only(records)
            per["ttt"].append(ttt)
            per["reduction"].append(1 - ttt / fixed if ttt and fixed else None)
            per["steady"].append(statistics.mean(r.virtual_s for r in rounds[3:]))
            per["final"].append(statistics.mean(r.test_accuracy for r in rounds[-5:]))
        s = settings(arm, 1, 0, **({"num_classes": SKEW_CLASSES} if "skew" in scenario else {}))
        entries.append(
            {
                "scenario": scenario,
                "arm": arm,
                "start": start,
                "settings": common.changed_settings(s),
                "target": target,
                "versus": fixed_arm,
                "seeds": list(seeds),
                **{f"{k}_per_seed": v for k, v in per.items()},
                "reached": sum(t is not None for t in per["ttt"]),
            }
        )
    return entries


def _pct(values: Sequence[float | None]) -> str:
    return common.spread([None if v is None else 100 * v for v in values], "{:.0f}") + " %"


def _table(entries: list[dict[str, Any]]) -> str:
    rows = [
        [
            e["scenario"],
            e["arm"],
            common.describe_settings(e["settings"]),
            f"{e['target']:g}",
            common.spread(e["ttt_per_seed"]),
            f"{e['reached']} of {len(e['seeds'])}",
            _pct(e["reduction_per_seed"]),
            common.spread([1e3 * v for v in e["steady_per_seed"]], "{:.0f}"),
            common.spread(e["final_per_seed"], "{:.3f}"),
        ]
        for e in entries
    ]
    return common.markdown_table(
        [
            "scenario",
            "arm",
            "settings",
            "target",
            "time to target (s, virtual)",
            "reached",
            "reduction vs its fixed split",
            "steady round (ms)",
            "final accuracy",
        ],
        rows,
    )
