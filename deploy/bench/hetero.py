"""OmniLearn's heterogeneity levels at the run-config defaults: the fixed split against the
static and dynamic controllers (issues: paper effects, hetero; the controller wins at the
defaults).

Every arm runs at the run config's defaults (global batch, bounds, learning rate,
aggregation, probe, deadband, ...); a row that changes a key says so in its ``settings``
column and in the entry (:func:`~deploy.bench.common.changed_settings`). What the benchmark
itself sets (rounds, the held-out set it scores on, the seed) is named in the footnote.

4 devices whose speeds follow OmniLearn's core counts (HL1 = 12/12/12/12, HL2 = 12/12/8/16,
HL4 = 9/9/6/24, HL8 = 6/6/4/32; slowdown = max cores / cores), one device 10x slower than
three equal ones (``straggler``), and the dynamic schedule HL1 -> 2 -> 4 -> 8 -> 8 -> 4 ->
2 -> 1. Compute is charged on the virtual clock as the line fitted to step times measured at
the start on this machine (the CNN, one thread), times a noise ratio drawn from the measured
step times (:class:`~deploy.bench.common.StepCost`), times the device's slowdown: the
controller sees noisy timings, as on a real device. Streams never limit a batch here.

Every time to target counts from virtual time 0: the timing probe before round 1 (the
static and dynamic arms'; the fixed split does not probe) is charged as its own record, and
each round pays the model's download and the update's upload at ``uplink-mbps``.

**The achievable reduction** of a scenario is what the best split of the global batch
within ``[b-min, b-max]`` cuts from the slowest device's round against the equal split, on
the benchmark's step-time line: a device's round being the model's download, its ``K``
steps and its update's upload (:func:`achievable`; the compute-only figure beside it). It
is the most any controller could gain here, and the yardstick of the goals: the dynamic
controller's cut in time to target, per seed, against it; its steady rounds (after round
3) against the achievable split's.

Further comparisons:

* **fidelity** (the paper's own setting): ``K = 1``, one synchronous step per round, where
  uneven batches do not change the training statistics (the weighted mean of one step each is
  the large-batch step).
* **heterogeneity with label skew**: HL8 with one label per device (4 classes): the fixed
  split, and the dynamic controller with each aggregation rule (``adaptive``, the default;
  ``fedavg``; ``fednova``), with per-class accuracy; and the three rules on IID streams.
* **a real dataset**: scikit-learn's digits at HL8 (full run).
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
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = [
    "LEVELS",
    "SCENARIOS",
    "Achievable",
    "achievable",
    "best_step",
    "ideal_speedup",
    "measure_step_time",
    "run",
    "slowdowns",
]

LEVELS = OMNILEARN_LEVELS
STRAGGLER = 10.0  # the straggler scenario's slowdown, against three devices at 1
#: Each scenario's slowdowns: OmniLearn's levels and one device 10x slower.
SCENARIOS: dict[str, tuple[float, ...]] = {
    **{level: tuple(max(c) / x for x in c) for level, c in LEVELS.items()},
    "straggler": (1.0, 1.0, 1.0, STRAGGLER),
}
GOAL_SCENARIOS = ("HL2", "HL4", "HL8", "straggler")
STEADY_LEVELS = ("HL2", "HL4", "HL8")
SCHEDULE = ("HL1", "HL2", "HL4", "HL8", "HL8", "HL4", "HL2", "HL1")
CONTROLLERS = CONTROLLER_MODES  # fixed, static, dynamic: every mode, side by side
TARGET_ACCURACY = 0.9
DIGITS_TARGET = 0.85  # digits (the second, real dataset) plateaus lower in these runs
SKEW_TARGET = 0.5  # one label per device converges lower and later
K1_LR = 0.5  # K = 1: no momentum builds up within a round (see _settings)
K1_TARGET = 0.8  # one step a round: a few hundred rounds reach 0.8
SKEW_CLASSES = 4  # one per device: every class is some device's
SKEW_RULES = ("adaptive", "fedavg", "fednova")  # the dynamic arms under label skew
EVAL_SAMPLES = 2000
FINAL_ROUNDS = 5  # final accuracy: the mean of the last this many rounds' evaluations
BALANCED = 1.1  # slowest step over the best split's counted as rebalanced
#: Goals (every seed): the dynamic arm's cut in time to target, at least this share of the
#: achievable; steady efficiency against the achievable split; final accuracy at most this
#: far below the fixed split's; the room the defaults leave (achievable reduction at HL4 and
#: HL8); controller periods to rebalance after a switch.
GOAL_SHARE = 0.8
GOAL_STEADY = 0.9
GOAL_POINTS = 0.01
GOAL_ROOM: dict[str, float] = {"HL4": 0.30, "HL8": 0.50}
GOAL_PERIODS = 3


def slowdowns(scenario: str) -> list[float]:
    """The scenario's slowdown per device (an OmniLearn level, or ``straggler``)."""
    return list(SCENARIOS[scenario])


def ideal_speedup(level: str) -> float:
    """OmniLearn's ideal (steps that cost nothing fixed): sum of speeds / (n * slowest)."""
    slow = slowdowns(level)
    return sum(1 / s for s in slow) / (len(slow) / max(slow))


def measure_step_time() -> common.StepCost:
    """What a step of the default CNN costs on this machine (one thread), with its noise."""
    model = build_model("cnn", DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)
    return common.measure_step_cost(model, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)


def best_step(
    slow: Sequence[float], cost: common.StepCost, total: int, b_min: int, b_max: int
) -> float:
    """The shortest slowest-device step any split of ``total`` within ``[b_min, b_max]``
    reaches (bisection on the step time T: device i takes ``(T / slowdown_i - a) / c``
    samples, clipped to the bounds)."""

    def takes(t: float) -> float:
        return sum(min(b_max, max(b_min, (t / s - cost.a) / cost.c)) for s in slow)

    lo = max(s * cost.line(b_min) for s in slow)  # nobody below b-min
    hi = max(s * cost.line(b_max) for s in slow)
    if takes(lo) >= total:
        return lo
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if takes(mid) >= total else (mid, hi)
    return hi


class Achievable:
    """The best split's cut of the slowest device's round at a scenario, on the step-time
    line: rounds of ``transfer_s + K * slowdown * line(b)``.

    Attributes
    ----------
    fixed_round_s, best_round_s : float
        The slowest device's round at the equal split and at the best split.
    reduction : float
        ``1 - best / fixed`` (rounds with their transfers).
    reduction_compute : float
        The same for the compute alone (``K`` steps).
    """

    def __init__(
        self, slow: Sequence[float], cost: common.StepCost, s: RunSettings, transfer_s: float
    ) -> None:
        k = s.local_steps
        equal = s.global_batch / len(slow)
        fixed_step = max(x * cost.line(round(equal)) for x in slow)
        best = best_step(slow, cost, s.global_batch, s.b_min, s.b_max)
        self.fixed_round_s = transfer_s + k * fixed_step
        self.best_round_s = transfer_s + k * best
        self.reduction = 1 - self.best_round_s / self.fixed_round_s
        self.reduction_compute = 1 - best / fixed_step

    @property
    def speedup(self) -> float:
        """The fixed split's round over the best split's."""
        return self.fixed_round_s / self.best_round_s


def achievable(
    scenario: str, cost: common.StepCost, transfer_s: float, s: RunSettings | None = None
) -> Achievable:
    """:class:`Achievable` at ``scenario`` for the settings ``s`` (the defaults)."""
    return Achievable(slowdowns(scenario), cost, s or RunSettings(), transfer_s)


def transfer_seconds(records: Sequence[RoundRecord], uplink_mbps: float) -> float:
    """A device's model download and update upload per round on the virtual clock, as the
    runs charged them: the broadcast and the mean update frame at ``uplink-mbps``."""
    rounds = rounds_only(records)
    ups = [m.bytes_up for r in rounds for m in r.devices.values() if m.bytes_up > 0]
    return (rounds[0].broadcast_bytes + statistics.mean(ups)) * 8 / (uplink_mbps * 1e6)


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
    *,
    checkpoint_dir: str = "",
    **changes: Any,
) -> RunSettings:
    """The run config's defaults with the benchmark's harness keys, the arm's controller
    and a row's ``changes`` (RunSettings field names)."""
    return RunSettings(
        controller=controller,
        num_rounds=rounds,
        eval_data=changes.get("dataset", "synthetic"),
        eval_samples=EVAL_SAMPLES,
        checkpoint_dir=checkpoint_dir,
        seed=seed,
        **changes,
    )


#: What a row changes from the defaults, per row kind (RunSettings field names). With
#: K = 1 the device's momentum buffer, made fresh each round, never builds up: the step is
#: 1 / (1 - 0.9) = 10x smaller than in a K = 20 round, so the fidelity rows use 10x the rate.
ROW_CHANGES: dict[str, dict[str, Any]] = {
    "digits": {"dataset": "digits", "sample_shape": "8,8", "num_classes": 10},
    "K1": dict(local_steps=1, lr=K1_LR),
    "skew": {"num_classes": SKEW_CLASSES},
}


def _fleet(scenario: str = "HL1", labels: int = 0) -> list[VirtualDevice]:
    """Four devices at a scenario's slowdowns, on streams that never limit a batch;
    ``labels``: that many classes per device (label skew over :data:`SKEW_CLASSES`)."""
    return [
        VirtualDevice(
            f"dev-{i}",
            slowdown=s,
            rate=math.inf,
            initial=0,
            labels=pick_classes(labels, SKEW_CLASSES, index=i) if labels else None,
        )
        for i, s in enumerate(slowdowns(scenario))
    ]


def slowest_step(record: RoundRecord, cost: common.StepCost, scenario: str) -> float:
    """The slowest device's step time at a round's batches (noise-free cost line)."""
    slow = slowdowns(scenario)
    return max(
        cost.line(m.batch_size) * slow[int(d.split("-")[1])] for d, m in record.devices.items()
    )


def imbalance(record: RoundRecord, cost: common.StepCost, scenario: str) -> float:
    """Slowest / fastest step time of a round's batches (1.0 = balanced), from the
    noise-free cost line: what the plan achieves, not one round's timing noise."""
    slow = slowdowns(scenario)
    steps = [
        cost.line(m.batch_size) * slow[int(d.split("-")[1])] for d, m in record.devices.items()
    ]
    return float(max(steps) / min(steps))


def level_at(rnd: int, phase: int) -> str:
    """The schedule's level in round ``rnd`` (1-based)."""
    return SCHEDULE[min((rnd - 1) // phase, len(SCHEDULE) - 1)]


def with_overhead(records: Sequence[RoundRecord], flower_s: float) -> list[RoundRecord]:
    """The records as a deployment would time them: each exchange (every round, and the
    timing probe's before round 1) also pays Flower's measured per-round orchestration."""
    return [replace(r, virtual_s=r.virtual_s + flower_s) for r in records]


Runs = dict[tuple[str, str, int], list[RoundRecord]]  # (row, arm, seed) -> rounds
#: What an entry gives per seed (as ``<figure>_per_seed``), in the entry's order.
PER_SEED = (
    "ttt",
    "ttt_overhead",
    "rounds",
    "reduction",
    "reduction_overhead",
    "of_achievable",
    "steady_efficiency",
    "final",
    "final_vs_fixed",
    "periods",
)


def run(quick: bool = False) -> common.Result:
    """Every scenario x controller, the schedule, the K = 1 fidelity check and the label
    skew, over :data:`~deploy.bench.common.SEEDS` (the first only with ``quick``)."""
    seeds = common.SEEDS[:1] if quick else common.SEEDS
    rounds = 16 if quick else 25
    phase = 3 if quick else 4
    k1_rounds = 150 if quick else 300
    cost = measure_step_time()
    flower_s, flower_note = common.flower_round_s()
    runs, per_class, changes = _run_arms(seeds, rounds, phase, k1_rounds, quick, cost)
    defaults = RunSettings()
    transfer_s = transfer_seconds(runs[("HL1", "fixed", seeds[0])], defaults.uplink_mbps)
    room = {sc: achievable(sc, cost, transfer_s) for sc in SCENARIOS}
    entries = _entries(runs, phase, seeds, per_class, changes, cost, room, flower_s)
    goals = _goals(entries, room)
    measured = ", ".join(f"b={b}: {t * 1e3:.2f} ms" for b, t in cost.table.items())
    table_md = _table(entries)
    table_md += common.footnote(
        f"4 devices; every row at the run-config defaults (B = {defaults.global_batch}, "
        f"b in [{defaults.b_min}, {defaults.b_max}], K = {defaults.local_steps}, lr "
        f"{defaults.lr:g}, aggregation {defaults.aggregation}, controller-probe "
        f"{defaults.controller_probe}) but the keys its settings column names; the benchmark "
        f"sets num-rounds ({rounds}; skew and IID rows {rounds * 2}, K = 1 rows {k1_rounds}), "
        f"eval-data (the task's own held-out set, {EVAL_SAMPLES} samples) and the seed. "
        f"Scenarios: OmniLearn's levels and one device {STRAGGLER:g}x slower than three equal "
        f"ones; rows '-digits': scikit-learn's 8x8 digits streamed as frames, target "
        f"{DIGITS_TARGET:g}; 'HL8-K1': one step per round, target {K1_TARGET:g}; 'skew-HL8': "
        f"one of {SKEW_CLASSES} classes per device, target {SKEW_TARGET:g}, and 'iid-HL8' the "
        f"same rules on IID streams; schedule {' -> '.join(SCHEDULE)} at {phase} rounds each; "
        f"seeds {', '.join(map(str, seeds))}, each figure the mean (min-max) over them. A "
        "target counts once held for two evaluations. Reduction = 1 - time(arm) / "
        "time(fixed), per seed, each time from 0 (the timing probe charged); 'with overhead' "
        f"adds to every exchange, the probe's too, {flower_s:.1f} s of Flower orchestration "
        f"({flower_note}). Achievable = the cut of the slowest device's round (the model's "
        f"download and upload, {transfer_s * 1e3:.1f} ms, and its K steps) that the best "
        "split within the bounds gives over the equal split, on the step-time line below "
        "(compute alone after the slash); of achievable = reduction / achievable; steady = "
        "(fixed / arm mean round time after round 3) / achievable speedup. Final accuracy: the "
        f"mean of the last {FINAL_ROUNDS} rounds' evaluations (every arm runs the same "
        f"rounds). Rebalanced = the slowest step within {BALANCED}x of the best split's. "
        f"Compute charged as {cost.describe()}, times the slowdown (measured minima: "
        f"{measured})",
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
            "defaults": {
                kebab(k): v
                for k, v in dict(
                    global_batch=defaults.global_batch,
                    b_min=defaults.b_min,
                    b_max=defaults.b_max,
                    local_steps=defaults.local_steps,
                    lr=defaults.lr,
                    aggregation=defaults.aggregation,
                    controller_probe=defaults.controller_probe,
                ).items()
            },
            "step_cost": {"a": cost.a, "c": cost.c, "sigma": cost.sigma, "table_ms": cost.table},
            "transfer_s": transfer_s,
            "achievable": {
                sc: {
                    "reduction": a.reduction,
                    "reduction_compute": a.reduction_compute,
                    "fixed_round_s": a.fixed_round_s,
                    "best_round_s": a.best_round_s,
                }
                for sc, a in room.items()
            },
            "flower_round_s": flower_s,
            "flower_round_note": flower_note,
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
) -> tuple[Runs, dict[tuple[str, str, int], list[float | None]], dict[tuple[str, str], Any]]:
    """Run every arm for each seed; their rounds, the skew arms' per-class accuracy, and
    each row's settings that differ from the defaults."""
    runs: Runs = {}
    per_class: dict[tuple[str, str, int], list[float | None]] = {}
    changes: dict[tuple[str, str], Any] = {}

    def fleet_run(
        key: tuple[str, str, int], devices: list[VirtualDevice], s: RunSettings, **kw: Any
    ) -> None:
        label = f"hetero {key[0]} {key[1]} seed {key[2]}"
        out = common.run_fleet(label, devices, s, key[2], step_time=cost.noisy(key[2]), **kw)
        runs[key] = out.records
        changes[key[:2]] = common.changed_settings(s)

    for seed in seeds:
        for scenario in SCENARIOS:
            for controller in CONTROLLERS:
                fleet_run(
                    (scenario, controller, seed),
                    _fleet(scenario),
                    _settings(controller, rounds, seed),
                )
        if not quick:  # the second, real dataset
            for controller in ("fixed", "dynamic"):
                fleet_run(
                    ("HL8-digits", controller, seed),
                    _fleet("HL8"),
                    _settings(controller, rounds, seed, **ROW_CHANGES["digits"]),
                )
        for controller in CONTROLLERS:
            fleet_run(
                ("schedule", controller, seed),
                _fleet(),
                _settings(controller, phase * len(SCHEDULE), seed),
                on_round=_switcher(phase),
            )
        for controller in ("fixed", "dynamic"):
            fleet_run(
                ("HL8-K1", controller, seed),
                _fleet("HL8"),
                _settings(controller, k1_rounds, seed, **ROW_CHANGES["K1"]),
            )
        for level, labels in (("skew-HL8", 1), ("iid-HL8", 0)):
            arms = [("fixed", RunSettings().aggregation)] if labels else []
            arms += [("dynamic", rule) for rule in SKEW_RULES]
            for controller, rule in arms:
                arm = controller if controller == "fixed" else f"dynamic/{rule}"
                with tempfile.TemporaryDirectory(prefix="fedstream-hetero-") as ckpt:
                    s = _settings(
                        controller,
                        rounds * 2,
                        seed,
                        checkpoint_dir=ckpt,
                        aggregation=rule,
                        **ROW_CHANGES["skew"],
                    )
                    fleet_run((level, arm, seed), _fleet("HL8", labels), s)
                    per_class[(level, arm, seed)] = _per_class(s)
    return runs, per_class, changes


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


def _base(row: str) -> str:
    """The scenario a row runs at (``HL8-digits``, ``skew-HL8``: HL8; schedule: none)."""
    return next((sc for sc in SCENARIOS if sc in row.split("-")), "")


def _final(records: Sequence[RoundRecord]) -> float:
    """The mean held-out accuracy of the last :data:`FINAL_ROUNDS` rounds."""
    return statistics.mean(r.test_accuracy for r in rounds_only(records)[-FINAL_ROUNDS:])


def _entries(
    runs: Runs,
    phase: int,
    seeds: Sequence[int],
    per_class: dict[tuple[str, str, int], list[float | None]],
    changes: dict[tuple[str, str], Any],
    cost: common.StepCost,
    room: dict[str, Achievable],
    flower_s: float,
) -> list[dict[str, Any]]:
    entries = []
    for row, arm in dict.fromkeys((row, arm) for row, arm, _ in runs):
        target = _target(row)
        # The room is the default task's at the defaults: none for another dataset, K or
        # class count (digits, K = 1, the skew rows), nor for the schedule.
        best = room.get(row)
        per_seed: dict[str, list[Any]] = {k: [] for k in PER_SEED}
        for seed in seeds:
            records = runs[(row, arm, seed)]
            ttt = common.time_to_target(records, target)
            ttt_o = common.time_to_target(with_overhead(records, flower_s), target)
            per_seed["ttt"].append(ttt)
            per_seed["ttt_overhead"].append(ttt_o)
            per_seed["rounds"].append(common.rounds_to_target(records, target))
            per_seed["final"].append(_final(records))
            fixed = runs.get((row, "fixed", seed))
            if fixed is None:
                continue
            t_f = common.time_to_target(fixed, target)
            t_fo = common.time_to_target(with_overhead(fixed, flower_s), target)
            cut = 1 - ttt / t_f if ttt and t_f else None
            per_seed["reduction"].append(cut)
            per_seed["reduction_overhead"].append(1 - ttt_o / t_fo if ttt_o and t_fo else None)
            per_seed["final_vs_fixed"].append(_final(records) - _final(fixed))
            if best is not None:
                share = cut / best.reduction if cut is not None and best.reduction > 0 else None
                per_seed["of_achievable"].append(share)
                steady = statistics.mean(r.virtual_s for r in rounds_only(records)[3:])
                fixed_steady = statistics.mean(r.virtual_s for r in rounds_only(fixed)[3:])
                per_seed["steady_efficiency"].append(fixed_steady / steady / best.speedup)
            if row == "schedule":
                per_seed["periods"].append(_periods_to_balance(rounds_only(records), phase, cost))
        entry: dict[str, Any] = {
            "level": row,
            "arm": arm,
            "settings": changes[(row, arm)],
            "target_accuracy": target,
            "achievable": None if best is None else best.reduction,
            "achievable_compute": None if best is None else best.reduction_compute,
            "seeds": list(seeds),
            **{f"{k}_per_seed": v for k, v in per_seed.items()},
            "reduction": common.mean_or_none(per_seed["reduction"]),
            "steady_efficiency": common.mean_or_none(per_seed["steady_efficiency"]),
            "imbalance_last": [
                imbalance(
                    runs[(row, arm, s)][-1],
                    cost,
                    _level_of(row, phase, len(rounds_only(runs[(row, arm, s)]))),
                )
                for s in seeds
            ],
            "batches_seed0": [r.planned for r in runs[(row, arm, seeds[0])]],
        }
        if row == "schedule":
            periods = per_seed["periods"]
            entry["periods_to_balance"] = (
                None if any(p is None for p in periods) else max(periods, default=None)
            )
        if (row, arm, seeds[0]) in per_class:
            classes = [per_class[(row, arm, s)] for s in seeds]
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
            common.describe_settings(e["settings"]),
            f"{e['target_accuracy']:g}",
            common.spread(e["ttt_per_seed"], "{:.2f}"),
            common.spread(e["rounds_per_seed"], "{:.0f}"),
            _pct_spread(e["reduction_per_seed"]),
            _pct_spread(e["reduction_overhead_per_seed"]),
            "-"
            if e["achievable"] is None
            else f"{e['achievable'] * 100:.0f} / {e['achievable_compute'] * 100:.0f} %",
            "-" if not e["achievable"] else common.spread(e["of_achievable_per_seed"]),
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
            "scenario",
            "arm",
            "settings",
            "target",
            "time to target (s, virtual)",
            "rounds",
            "reduction vs fixed",
            "with overhead",
            "achievable (round / compute)",
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


def _level_of(row: str, phase: int, rnd: int) -> str:
    """The scenario a row's devices run at in round ``rnd``."""
    return level_at(rnd, phase) if row == "schedule" else _base(row)


def _periods_to_balance(
    records: list[RoundRecord], phase: int, cost: common.StepCost
) -> int | None:
    """Worst, over the schedule's switches, of rounds until the plan is balanced: its slowest
    step within :data:`BALANCED` of the best any split can reach at the new level (the round
    of the switch itself runs the old plan: it is where the change is measured)."""
    s = RunSettings()
    worst = 0
    for k in range(1, len(SCHEDULE)):
        if SCHEDULE[k] == SCHEDULE[k - 1]:
            continue
        start = k * phase  # 0-based index of the first round at the new level
        window = records[start : start + phase]
        best = best_step(slowdowns(SCHEDULE[k]), cost, s.global_batch, s.b_min, s.b_max)
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


def _goals(entries: list[dict[str, Any]], room: dict[str, Achievable]) -> dict[str, Any]:
    """Each goal judged by :func:`~deploy.bench.common.every_seed`."""
    by = {(e["level"], e["arm"]): e for e in entries}
    dyn = {sc: by[(sc, "dynamic")] for sc in GOAL_SCENARIOS}
    shares = {
        sc: common.every_seed(e["of_achievable_per_seed"], lambda v: v >= GOAL_SHARE)
        for sc, e in dyn.items()
    }
    steady = {
        lv: common.every_seed(dyn[lv]["steady_efficiency_per_seed"], lambda v: v >= GOAL_STEADY)
        for lv in STEADY_LEVELS
    }
    final = {
        sc: common.every_seed(e["final_vs_fixed_per_seed"], lambda v: v >= -GOAL_POINTS)
        for sc, e in dyn.items()
    }
    rooms = {lv: room[lv].reduction >= floor for lv, floor in GOAL_ROOM.items()}
    skew = common.every_seed(by[("skew-HL8", "dynamic/adaptive")]["ttt_per_seed"], bool)
    periods = by[("schedule", "dynamic")].get("periods_to_balance")
    rebalance = periods is not None and periods <= GOAL_PERIODS

    def per(part: dict[str, bool], figures: Callable[[str], str]) -> str:
        return "; ".join(f"{k} {figures(k)} ({common.verdict(v)})" for k, v in part.items())

    text = (
        f"dynamic controller, every seed: cut in time to target >= {GOAL_SHARE:g} x the "
        "achievable: "
        + per(
            shares,
            lambda sc: f"{_cuts(dyn[sc]['of_achievable_per_seed'])} of {_pct(room[sc].reduction)}",
        )
        + f"; steady efficiency >= {GOAL_STEADY:g}: "
        + per(steady, lambda lv: _cuts(dyn[lv]["steady_efficiency_per_seed"]))
        + f"; final accuracy at most {GOAL_POINTS * 100:g} point below the fixed split's: "
        + per(final, lambda sc: _points(dyn[sc]["final_vs_fixed_per_seed"]))
        + "; the defaults leave room (achievable): "
        + per(rooms, lambda lv: f"{_pct(room[lv].reduction)} >= {_pct(GOAL_ROOM[lv])}")
        + "; label skew, the default rule holds the target in every seed: "
        + f"{common.verdict(skew)}; rebalanced within {GOAL_PERIODS} periods after each "
        + f"switch, worst seed: {periods} ({common.verdict(rebalance)})"
    )
    met = {
        "of_achievable": shares,
        "steady": steady,
        "final": final,
        "room": rooms,
        "skew": skew,
        "rebalance": rebalance,
    }
    return {"met": met, "text": text}


def _cuts(values: Sequence[float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.2f}" for v in values)


def _points(values: Sequence[float | None]) -> str:
    return "/".join("-" if v is None else f"{v * 100:+.1f}" for v in values)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


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
        common.Panel("virtual seconds", "accuracy"),
        common.Panel(
            "round (schedule HL1-2-4-8-8-4-2-1)", "slowest / fastest step time", yscale="log"
        ),
        common.Panel("round (schedule, dynamic)", "planned batch"),
    ]
    return common.save_figure(out / "hetero.png", panels, draw, width=5.3)
