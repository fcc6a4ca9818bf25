"""OmniLearn's heterogeneity levels: fixed vs static vs dynamic batch control (issue: paper
effects, hetero; re-measured for honest seed reproductions).

4 devices whose speeds follow OmniLearn's core counts (HL1 = 12/12/12/12, HL2 = 12/12/8/16,
HL4 = 9/9/6/24, HL8 = 6/6/4/32; slowdown = max cores / cores), plus the dynamic schedule
HL1 -> 2 -> 4 -> 8 -> 8 -> 4 -> 2 -> 1. Compute is charged on the virtual clock as the line
fitted to step times measured at the start on this machine (the CNN, one thread), times a
noise ratio drawn from the measured step times (:class:`~deploy.bench.common.StepCost`),
times the device's slowdown: the controller sees noisy timings, as on a real device, and the
comparison does not depend on what else the host runs. Streams never limit a batch here.

Every time to target counts from virtual time 0: the timing probe before round 1 (the
static and dynamic arms'; the fixed split does not probe) is charged as its own record. It is
given twice: on the in-process clock (each round: its slowest device's model download,
compute and update upload, and the aggregator's aggregation and evaluation), and with what a
real deployment adds to every exchange, the probe's included, whatever the batches: Flower's
per-round orchestration as measured on this machine (:data:`FLOWER_ROUND_S`).

Two further comparisons:

* **fidelity** (the paper's own setting): ``K = 1``, one synchronous step per round, where
  uneven batches do not change the training statistics (the weighted mean of one step each is
  the large-batch step). fedstream's default is local SGD (``K`` steps per round), where a
  device with a larger batch also takes larger steps away from the global model.
* **heterogeneity with label skew**: HL8 with one label per device (4 classes): the fixed
  split, the dynamic controller with sample-weighted averaging (``fedavg``) and with FedNova's
  normalised averaging (``fednova``), with per-class accuracy; and the same two aggregations
  on IID streams, to choose the default.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from aggregator.checkpoint import load_checkpoint
from aggregator.round_log import RoundRecord, rounds_only
from deploy.bench import common
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.emulation.sources import pick_classes
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.datasets import load_dataset
from edge_client.task.diagnostics import per_class_accuracy
from edge_client.task.models import build_model
from edge_client.wire.constants import CONTROLLER_MODES, OMNILEARN_LEVELS
from edge_client.wire.run_config import RunSettings

__all__ = ["LEVELS", "measure_step_time", "run"]

LEVELS = OMNILEARN_LEVELS
SCHEDULE = ("HL1", "HL2", "HL4", "HL8", "HL8", "HL4", "HL2", "HL1")
CONTROLLERS = CONTROLLER_MODES  # fixed, static, dynamic: every mode, side by side
TARGET_ACCURACY = 0.9
DIGITS_TARGET = 0.85  # digits (the second, real dataset) plateaus lower in these runs
SKEW_TARGET = 0.5  # one label per device converges lower and later
K1_LR = 0.5  # K = 1: no momentum builds up within a round (see _settings)
K1_TARGET = 0.8  # one step a round: a few hundred rounds reach 0.8
SKEW_CLASSES = 4  # one per device: every class is some device's
BALANCED = 1.1  # slowest / fastest step time counted as balanced (the deadband is 5 %)
GLOBAL_BATCH = 512
LOCAL_STEPS = 20
#: Seconds a round of a plain Flower 1.42 app (Flower's FedAvg and ``Strategy.start``, 4
#: SuperNodes, a ClientApp that imports torch and trains nothing, the 6k-parameter model)
#: takes on Flower's deployment engine on this 2-core machine: ``python dev/flower_overhead.py``,
#: median of rounds 2-6 (10.1-14.3 s), 2026-11-30. Most of it is Flower's polling (3 s
#: sleeps on the SuperNode and in the ServerApp's grid) and a ClientApp process started, and
#: torch imported, per message. Charged per round in the "with overhead" figures.
FLOWER_ROUND_S = 13.4
FLOWER_ROUND_NOTE = (
    "median round of a plain Flower 1.42 app, 4 SuperNodes, this machine: dev/flower_overhead.py"
)
GOALS = {"efficiency": 0.85, "HL2": 0.14, "HL8": 0.60, "periods": 3}


def slowdowns(level: str) -> list[float]:
    cores = LEVELS[level]
    return [max(cores) / c for c in cores]


def ideal_speedup(level: str) -> float:
    """If work were split by speed: sum of speeds / (n * slowest speed)."""
    cores = LEVELS[level]
    return sum(cores) / (len(cores) * min(cores))


def measure_step_time() -> common.StepCost:
    """What a step of the default CNN costs on this machine (one thread), with its noise."""
    model = build_model("cnn", DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)
    return common.measure_step_cost(model, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)


def _target(level: str) -> float:
    if level.endswith("-digits"):
        return DIGITS_TARGET
    if level.endswith("-K1"):
        return K1_TARGET
    return SKEW_TARGET if level.startswith("skew") else TARGET_ACCURACY


def _settings(
    controller: str,
    rounds: int,
    seed: int,
    dataset: str = "synthetic",
    *,
    local_steps: int = LOCAL_STEPS,
    aggregation: str = "fedavg",  # the papers' weighting, unless a row compares
    num_classes: int = DEFAULT_NUM_CLASSES,
    checkpoint_dir: str = "",
) -> RunSettings:
    digits = dataset == "digits"
    # With K = 1 the device's momentum buffer, made fresh each round, never builds up: the
    # step is 1 / (1 - 0.9) = 10x smaller than in a K = 20 round. The fidelity rows use 10x
    # the rate so that both reach the target in a few hundred rounds.
    return RunSettings(
        lr=K1_LR if local_steps == 1 else RunSettings().lr,
        dataset=dataset,
        sample_shape="8,8" if digits else RunSettings().sample_shape,
        num_classes=10 if digits else num_classes,
        eval_data=dataset,
        num_rounds=rounds,
        local_steps=local_steps,
        global_batch=GLOBAL_BATCH,
        b_min=8,
        b_max=GLOBAL_BATCH,
        controller=controller,
        aggregation=aggregation,
        availability_cap=False,  # streams never limit here: the controller alone decides
        eval_samples=400 if digits else 2000,
        checkpoint_dir=checkpoint_dir,
        seed=seed,
    )


def _fleet(level: str = "HL1", labels: int = 0) -> list[VirtualDevice]:
    """Four devices at a level's slowdowns, on streams that never limit a batch; ``labels``:
    that many classes per device (label skew over :data:`SKEW_CLASSES`)."""
    return [
        VirtualDevice(
            f"dev-{i}",
            slowdown=s,
            rate=math.inf,
            initial=0,
            labels=pick_classes(labels, SKEW_CLASSES, index=i) if labels else None,
        )
        for i, s in enumerate(slowdowns(level))
    ]


def imbalance(record: RoundRecord, cost: common.StepCost, level: str) -> float:
    """Slowest / fastest step time of a round's batches at a level (1.0 = balanced), from
    the noise-free cost line: what the plan achieves, not one round's timing noise."""
    slow = slowdowns(level)
    steps = [
        cost.line(m.batch_size) * slow[int(d.split("-")[1])] for d, m in record.devices.items()
    ]
    return float(max(steps) / min(steps))


def slowest_step(record: RoundRecord, cost: common.StepCost, level: str) -> float:
    """The slowest device's step time at a round's batches (noise-free cost line)."""
    slow = slowdowns(level)
    return max(
        cost.line(m.batch_size) * slow[int(d.split("-")[1])] for d, m in record.devices.items()
    )


def best_step(level: str, cost: common.StepCost, b_min: int = 8) -> float:
    """The shortest slowest-device step time any split of B can reach at a level, with the
    cost line's fixed part (bisection on the step time T: device i takes
    ``(T / slowdown_i - a) / c`` samples, within ``[b_min, B]``)."""
    slow = slowdowns(level)

    def takes(t: float) -> float:
        return sum(min(GLOBAL_BATCH, max(b_min, (t / s - cost.a) / cost.c)) for s in slow)

    lo = max(s * cost.line(b_min) for s in slow)  # nobody below b-min
    hi = max(s * cost.line(GLOBAL_BATCH) for s in slow)
    if takes(lo) >= GLOBAL_BATCH:
        return lo
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if takes(mid) >= GLOBAL_BATCH else (mid, hi)
    return hi


def achievable_speedup(level: str, cost: common.StepCost) -> float:
    """The fixed split's step time over :func:`best_step`: what any controller could reach
    here, where the paper's ideal (:func:`ideal_speedup`) assumes steps cost nothing fixed."""
    fixed = max(s * cost.line(GLOBAL_BATCH // len(LEVELS[level])) for s in slowdowns(level))
    return fixed / best_step(level, cost)


def level_at(rnd: int, phase: int) -> str:
    """The schedule's level in round ``rnd`` (1-based)."""
    return SCHEDULE[min((rnd - 1) // phase, len(SCHEDULE) - 1)]


def with_overhead(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """The records as a deployment would time them: each exchange (every round, and the
    timing probe's before round 1) also pays Flower's per-round orchestration
    (:data:`FLOWER_ROUND_S`); the model's download is on the virtual clock already."""
    return [replace(r, virtual_s=r.virtual_s + FLOWER_ROUND_S) for r in records]


Runs = dict[tuple[str, str, int], list[RoundRecord]]  # (level, arm, seed) -> rounds
#: What an entry gives per seed (as ``<figure>_per_seed``), in the entry's order.
PER_SEED = (
    "ttt",
    "ttt_overhead",
    "rounds",
    "reduction",
    "reduction_overhead",
    "efficiency",
    "steady_efficiency",
    "of_achievable",
    "final",
    "periods",
)


def run(quick: bool = False) -> common.Result:
    """Every level x controller, the schedule, the K = 1 fidelity check and the label-skew
    comparison, over :data:`~deploy.bench.common.SEEDS` (the first only with ``quick``)."""
    seeds = common.SEEDS[:1] if quick else common.SEEDS
    rounds = 16 if quick else 25
    phase = 3 if quick else 4
    k1_rounds = 150 if quick else 300
    cost = measure_step_time()
    runs, per_class = _run_arms(seeds, rounds, phase, k1_rounds, quick, cost)
    entries = _entries(runs, phase, seeds, per_class, cost)
    table_md = _table(entries)
    goals = _goals(entries)
    measured = ", ".join(f"b={b}: {t * 1e3:.2f} ms" for b, t in cost.table.items())
    table_md += common.footnote(
        f"4 devices, B={GLOBAL_BATCH}, {LOCAL_STEPS} local steps, b in [8, {GLOBAL_BATCH}], "
        f"{rounds} rounds per level (rows '-digits': scikit-learn's 8x8 digits streamed as "
        f"frames, 10 classes, target {DIGITS_TARGET:g}; 'HL8-K1': one step per round, "
        f"{k1_rounds} rounds, lr {K1_LR:g}, target {K1_TARGET:g}; 'skew-HL8': one of "
        f"{SKEW_CLASSES} classes per device, "
        f"{rounds * 2} rounds, target {SKEW_TARGET:g}, and 'iid-HL8' the same on IID streams); "
        f"schedule {' -> '.join(SCHEDULE)} at {phase} rounds each; seeds "
        f"{', '.join(map(str, seeds))}, each figure the mean (min-max) over them. A target "
        "counts once held for two evaluations. Reduction = 1 - time(controller) / time(fixed), "
        "per seed, each time from 0 (the timing probe of the static and dynamic arms charged); "
        "each round also pays the model's download and the aggregator's work; 'with "
        f"overhead' adds to every exchange, the probe's too, {FLOWER_ROUND_S:g} s of Flower "
        f"orchestration ({FLOWER_ROUND_NOTE}). Efficiency = "
        "(time fixed / time controller) / ideal speedup (the paper's: sum of speeds / (n x "
        "slowest), as if a step cost nothing fixed); achievable = the fixed split's slowest "
        "step over the shortest slowest step any split of B reaches with the cost line below "
        "(its fixed part pins slow devices at b-min); of achievable = the speedup over it; "
        "steady = efficiency from mean round times after round 3. Rebalanced = the slowest "
        f"step within {BALANCED}x of that best. Compute charged as "
        f"{cost.describe()}, times the slowdown (measured minima: {measured})",
        goals["text"],
    )
    return common.Result(
        "hetero",
        entries,
        table_md,
        meta={
            "rounds": rounds,
            "quick": quick,
            "seeds": list(seeds),
            "step_cost": {"a": cost.a, "c": cost.c, "table_ms": cost.table},
            "flower_round_s": FLOWER_ROUND_S,
            "balanced_within": BALANCED,
            "goals": goals,
        },
        plots=[lambda out_dir: _plot(runs, seeds[0], cost, phase, out_dir)],
    )


def _run_arms(
    seeds: Sequence[int],
    rounds: int,
    phase: int,
    k1_rounds: int,
    quick: bool,
    cost: common.StepCost,
) -> tuple[Runs, dict[tuple[str, str, int], list[float | None]]]:
    """Run every arm for each seed: the levels, the digits (not ``quick``), the schedule, the
    K = 1 check and the label skew; their rounds, and the skew arms' per-class accuracy."""
    runs: Runs = {}
    per_class: dict[tuple[str, str, int], list[float | None]] = {}

    def fleet_run(
        label: str,
        key: tuple[str, str, int],
        devices: list[VirtualDevice],
        s: RunSettings,
        **kw: Any,
    ) -> None:
        out = common.run_fleet(label, devices, s, key[2], step_time=cost.noisy(key[2]), **kw)
        runs[key] = out.records

    for seed in seeds:
        for level in LEVELS:
            for controller in CONTROLLERS:
                fleet_run(
                    f"hetero {level} {controller} seed {seed}",
                    (level, controller, seed),
                    _fleet(level),
                    _settings(controller, rounds, seed),
                )
        if not quick:  # the second, real dataset
            for controller in ("fixed", "dynamic"):
                fleet_run(
                    f"hetero HL8 digits {controller} seed {seed}",
                    ("HL8-digits", controller, seed),
                    _fleet("HL8"),
                    _settings(controller, rounds, seed, "digits"),
                )
        for controller in CONTROLLERS:
            fleet_run(
                f"hetero schedule {controller} seed {seed}",
                ("schedule", controller, seed),
                _fleet(),
                _settings(controller, phase * len(SCHEDULE), seed),
                on_round=_switcher(phase),
            )
        for controller in ("fixed", "dynamic"):
            fleet_run(
                f"hetero HL8 K=1 {controller} seed {seed}",
                ("HL8-K1", controller, seed),
                _fleet("HL8"),
                _settings(controller, k1_rounds, seed, local_steps=1),
            )
        for level, labels in (("skew-HL8", 1), ("iid-HL8", 0)):
            arms = [("fixed", "fedavg"), ("dynamic", "fedavg"), ("dynamic", "fednova")]
            for controller, aggregation in arms if labels else arms[1:]:
                arm = f"{controller}/{aggregation}"
                with tempfile.TemporaryDirectory(prefix="fedstream-hetero-") as ckpt:
                    s = _settings(
                        controller,
                        rounds * 2,
                        seed,
                        aggregation=aggregation,
                        num_classes=SKEW_CLASSES,
                        checkpoint_dir=ckpt,
                    )
                    fleet_run(
                        f"hetero {level} {arm} seed {seed}",
                        (level, arm, seed),
                        _fleet("HL8", labels),
                        s,
                    )
                    per_class[(level, arm, seed)] = _per_class(s)
    return runs, per_class


def _switcher(phase: int) -> Callable[[int, InProcessGrid], None]:
    """An ``on_round`` hook that walks the devices through :data:`SCHEDULE`."""

    def switch(rnd: int, grid: InProcessGrid) -> None:
        level = level_at(rnd, phase)
        for dev, s in zip(grid.devices.values(), slowdowns(level), strict=True):
            dev.slowdown = s

    return switch


def _per_class(settings: RunSettings) -> list[float | None]:
    """Per-class held-out accuracy of a run's final model (from its checkpoint)."""
    ckpt = load_checkpoint(settings.checkpoint_dir)
    assert ckpt is not None, "the run wrote no checkpoint"
    data = load_dataset(settings.dataset, settings.shape, settings.num_classes)
    x, y = data.eval_set(settings.eval_samples, settings.seed)
    model = build_model(settings.model, data.shape, settings.num_classes)
    model.load_state_dict(ckpt.arrays.to_torch_state_dict())
    return per_class_accuracy(model, x, y, settings.num_classes)


def _entries(
    runs: Runs,
    phase: int,
    seeds: Sequence[int],
    per_class: dict[tuple[str, str, int], list[float | None]],
    cost: common.StepCost,
) -> list[dict[str, Any]]:
    entries = []
    arms = dict.fromkeys((level, arm) for level, arm, _ in runs)
    for level, arm in arms:
        target = _target(level)
        base = level.removesuffix("-digits").removesuffix("-K1").split("-")[-1]
        ideal = ideal_speedup(base) if base in LEVELS else _schedule_ideal(phase)
        achievable = achievable_speedup(base, cost) if base in LEVELS else None
        reference = "fixed/fedavg" if level.startswith("skew") else "fixed"
        per_seed: dict[str, list[Any]] = {k: [] for k in PER_SEED}
        for seed in seeds:
            records = runs[(level, arm, seed)]
            ttt = common.time_to_target(records, target)
            ttt_o = common.time_to_target(with_overhead(records), target)
            per_seed["ttt"].append(ttt)
            per_seed["ttt_overhead"].append(ttt_o)
            per_seed["rounds"].append(common.rounds_to_target(records, target))
            per_seed["final"].append(records[-1].test_accuracy)
            fixed = runs.get((level, reference, seed))
            if fixed is None:
                continue
            t_f = common.time_to_target(fixed, target)
            t_fo = common.time_to_target(with_overhead(fixed), target)
            per_seed["reduction"].append(1 - ttt / t_f if ttt and t_f else None)
            per_seed["reduction_overhead"].append(1 - ttt_o / t_fo if ttt_o and t_fo else None)
            per_seed["efficiency"].append(t_f / ttt / ideal if ttt and t_f else None)
            steady = statistics.mean(r.virtual_s for r in rounds_only(records)[3:])
            fixed_steady = statistics.mean(r.virtual_s for r in rounds_only(fixed)[3:])
            per_seed["steady_efficiency"].append(fixed_steady / steady / ideal)
            if achievable is not None:
                per_seed["of_achievable"].append(t_f / ttt / achievable if ttt and t_f else None)
            if level == "schedule":
                per_seed["periods"].append(_periods_to_balance(rounds_only(records), phase, cost))
        entry: dict[str, Any] = {
            "level": level,
            "arm": arm,
            "target_accuracy": target,
            "ideal_speedup": ideal,
            "achievable_speedup": achievable,
            "seeds": list(seeds),
            **{f"{k}_per_seed": v for k, v in per_seed.items()},
            "reduction": common.mean_or_none(per_seed["reduction"]),
            "reduction_overhead": common.mean_or_none(per_seed["reduction_overhead"]),
            "efficiency": common.mean_or_none(per_seed["efficiency"]),
            "steady_efficiency": common.mean_or_none(per_seed["steady_efficiency"]),
            "of_achievable": common.mean_or_none(per_seed["of_achievable"]),
            "imbalance_last": [
                imbalance(
                    runs[(level, arm, s)][-1],
                    cost,
                    _level_of(level, phase, len(rounds_only(runs[(level, arm, s)]))),
                )
                for s in seeds
            ],
            "batches_seed0": [r.planned for r in runs[(level, arm, seeds[0])]],
        }
        if level == "schedule":
            periods = per_seed["periods"]
            entry["periods_to_balance"] = (
                None if any(p is None for p in periods) else max(periods, default=None)
            )
        if (level, arm, seeds[0]) in per_class:
            classes = [per_class[(level, arm, s)] for s in seeds]
            entry["per_class_accuracy"] = [
                common.mean_or_none([c[i] for c in classes]) for i in range(len(classes[0]))
            ]
        entries.append(entry)
    return entries


def _table(entries: list[dict[str, Any]]) -> str:
    rows = [
        [
            e["level"],
            e["arm"],
            f"{e['target_accuracy']:g}",
            common.spread(e["ttt_per_seed"], "{:.2f}"),
            common.spread(e["rounds_per_seed"], "{:.0f}"),
            _pct_spread(e["reduction_per_seed"]),
            _pct_spread(e["reduction_overhead_per_seed"]),
            f"{e['ideal_speedup']:.2f}x",
            "-" if e["achievable_speedup"] is None else f"{e['achievable_speedup']:.2f}x",
            common.spread(e["efficiency_per_seed"]),
            common.spread(e["of_achievable_per_seed"]),
            common.spread(e["steady_efficiency_per_seed"]),
            common.spread(e["final_per_seed"], "{:.3f}"),
            " / ".join("-" if a is None else f"{a:.2f}" for a in e.get("per_class_accuracy", []))
            or "-",
            e.get("periods_to_balance", "-"),
        ]
        for e in entries
    ]
    return common.markdown_table(
        [
            "level",
            "arm",
            "target",
            "time to target (s, compute)",
            "rounds",
            "reduction vs fixed",
            "with overhead",
            "ideal speedup",
            "achievable",
            "efficiency",
            "of achievable",
            "steady",
            "final accuracy",
            "per-class accuracy",
            "periods to rebalance",
        ],
        rows,
    )


def _pct_spread(values: Sequence[float | None]) -> str:
    if not values:
        return "-"
    return common.spread([None if v is None else v * 100 for v in values], "{:.0f}") + " %"


def _schedule_ideal(phase: int) -> float:
    """Ideal speedup over the whole schedule: time-weighted by each phase's fixed round time."""
    weights = [max(slowdowns(level)) for level in SCHEDULE]  # fixed: the slowest device
    ideal_time = [w / ideal_speedup(level) for w, level in zip(weights, SCHEDULE, strict=True)]
    return sum(weights) / sum(ideal_time)


def _level_of(level: str, phase: int, rnd: int) -> str:
    """The OmniLearn level a row's devices run at in round ``rnd``."""
    if level == "schedule":
        return level_at(rnd, phase)
    return next(lv for lv in LEVELS if lv in level)


def _periods_to_balance(
    records: list[RoundRecord], phase: int, cost: common.StepCost
) -> int | None:
    """Worst, over the schedule's switches, of rounds until the plan is balanced: its slowest
    step within :data:`BALANCED` of the best any split can reach at the new level (the round
    of the switch itself runs the old plan: it is where the change is measured)."""
    worst = 0
    for k in range(1, len(SCHEDULE)):
        if SCHEDULE[k] == SCHEDULE[k - 1]:
            continue
        start = k * phase  # 0-based index of the first round at the new level
        window = records[start : start + phase]
        best = best_step(SCHEDULE[k], cost)
        hit = next(
            (
                i
                for i, r in enumerate(window)
                if slowest_step(r, cost, SCHEDULE[k]) <= BALANCED * best
            ),
            None,
        )
        if hit is None:
            return None
        worst = max(worst, hit)
    return worst


def _goals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(e["level"], e["arm"]): e for e in entries}
    eff = {lv: by[(lv, "dynamic")]["efficiency"] for lv in ("HL2", "HL4", "HL8")}
    achieved = {lv: by[(lv, "dynamic")]["of_achievable"] for lv in ("HL2", "HL4", "HL8")}
    red2, red8 = by[("HL2", "dynamic")]["reduction"], by[("HL8", "dynamic")]["reduction"]
    periods = by[("schedule", "dynamic")]["periods_to_balance"]
    met = {
        "efficiency": all(v is not None and v >= GOALS["efficiency"] for v in eff.values()),
        "reduction_hl2": red2 is not None and red2 >= GOALS["HL2"],
        "reduction_hl8": red8 is not None and red8 >= GOALS["HL8"],
        "rebalance": periods is not None and periods <= GOALS["periods"],
    }
    text = (
        f"dynamic efficiency >= {GOALS['efficiency']} at HL2/4/8 (compute only, mean over "
        "seeds): "
        + "/".join(_ratio(v) for v in eff.values())
        + f" ({common.verdict(met['efficiency'])}; of the achievable: "
        + "/".join(_ratio(v) for v in achieved.values())
        + "); reduction >= 14 % at HL2: "
        f"{_pct(red2)} ({common.verdict(met['reduction_hl2'])}), >= 60 % at HL8: "
        f"{_pct(red8)} ({common.verdict(met['reduction_hl8'])}); rebalanced (slowest step within "
        f"{BALANCED}x of the best split's) within {GOALS['periods']} periods after each "
        "switch, worst seed: "
        f"{periods} ({common.verdict(met['rebalance'])})"
    )
    return {"met": met, "efficiency": eff, "text": text}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _plot(runs: Runs, seed: int, cost: common.StepCost, phase: int, out: Path) -> Path:
    schedule = rounds_only(runs[("schedule", "dynamic", seed)])

    def draw(axes: list[Axes]) -> None:
        for controller in CONTROLLERS:
            records = runs[("HL8", controller, seed)]
            clock = np.cumsum([r.virtual_s for r in records])
            axes[0].plot(clock, [r.test_accuracy for r in records], label=f"HL8 {controller}")
            sched = rounds_only(runs[("schedule", controller, seed)])
            spreads = [imbalance(r, cost, level_at(r.round, phase)) for r in sched]
            axes[1].plot([r.round for r in sched], spreads, label=controller)
        for dev in sorted(schedule[0].planned):
            axes[2].plot([r.planned.get(dev, np.nan) for r in schedule], label=dev)

    panels = [
        common.Panel("virtual seconds (compute only)", "accuracy"),
        common.Panel(
            "round (schedule HL1-2-4-8-8-4-2-1)", "slowest / fastest step time", yscale="log"
        ),
        common.Panel("round (schedule, dynamic)", "planned batch"),
    ]
    return common.save_figure(out / "hetero.png", panels, draw, width=5.3)
