"""ScaDLES' stream-rate effects: rate-aware training against conventional synchronous SGD on
streams, with the conventional batch tuned (issue: paper effects, streams; re-measured for
honest seed reproductions).

8 devices of equal speed whose stream rates are drawn from ScaDLES' sets S1, S2, S1p, S2p
(per device and seed). Every arm runs for the same declared length of virtual time per rate
set (:data:`RUN_S`), so that buffers, accuracy and samples dropped compare at equal time.

* **fixed-b** (conventional synchronous SGD on streams): a fixed batch of ``b`` per device
  (``b`` in :data:`FIXED_BATCHES`; 64 is ScaDLES' own baseline), each device waits until its
  ``b x K`` samples have streamed in (``wait``, up to the round deadline), buffers keep
  everything until consumed (``persistence``), no availability cap. The best ``b`` per rate
  set and seed is the tuned baseline a fair competitor would run.
* **ScaDLES**: the dynamic controller with the availability cap (no device is asked for more
  than its buffer plus its stream can give it in a round: rate-aware batches), ``adapt``
  (train on what is there, never below b-min), ``truncation`` at one round's share of a
  64-per-device plan, sample-weighted aggregation with the learning rate scaled by sum(b)/B;
  ``scadles`` at ScaDLES' B = 8 x 64, ``scadles-64`` at B = 8 x 8, the global batch of the
  best fixed arm (whose learning-rate scale then rarely binds). Both scale the rate by
  ``sum(b) / B`` as the paper does (``lr-batch = 0``).
* **defaults**: fedstream as it ships (every run-config key at its default: B = 512, the
  ``adaptive`` rule, the rate scaled only below ``lr-batch`` samples a step, the probe),
  with the ScaDLES arms' truncating buffers.

Every arm trains at the default learning rate (0.05): the fixed arms at any B, ScaDLES scaled
down by sum(b)/B when streams cap its batches (the linear scaling rule, which the fixed arms
do not apply).

Compute is charged from the step-time line measured at the start times measured noise
(:class:`~deploy.bench.common.StepCost`); waits at each stream's rate: all on the virtual
clock, whose stream arrivals are a function of rate and time
(:class:`~edge_client.emulation.virtual_stream.VirtualStream`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from aggregator.round_log import rounds_only
from deploy.bench import common
from deploy.bench.hetero import measure_step_time
from deploy.inprocess import VirtualDevice
from edge_client.emulation.schedule import draw_rate
from edge_client.runtime.constants import POLICY_PERSISTENCE, POLICY_TRUNCATION
from edge_client.runtime.seeding import device_rng
from edge_client.wire.constants import RATE_SETS
from edge_client.wire.run_config import RunSettings

__all__ = ["run"]

DEVICES = 8
PAPER_BATCH = 64  # per device: ScaDLES' conventional baseline
FIXED_BATCHES = (8, 16, 32, 64)
LOCAL_STEPS = 20
TARGET_ACCURACY = 0.8
PERSISTENCE_CAP = 1_000_000  # the baseline's disk cap, in samples
TRUNCATION_CAP = PAPER_BATCH * LOCAL_STEPS  # one round's share of a 64-per-device plan
#: Declared run length per rate set, virtual seconds (the slow sets need longer to learn).
RUN_S = {"S1": 1200.0, "S2": 90.0, "S1p": 400.0, "S2p": 90.0}
QUICK_FRACTION = 0.5  # --quick runs this fraction of each length, one seed
GOALS = {"speedup_S1p": 3.29, "accuracy_points": 0.01, "buffer_reduction": 100.0}


def rates(rate_set: str, seed: int) -> list[float]:
    return [draw_rate(rate_set, device_rng(seed, f"dev-{i}", 1)) for i in range(DEVICES)]


def _arm(method: str, rate_list: list[float], seed: int) -> tuple[list[VirtualDevice], RunSettings]:
    """The fleet and settings of one arm: ``scadles``, ``scadles-<B>``, ``fixed-<b>`` or
    ``defaults``."""
    harness = {"eval_data": "synthetic", "eval_samples": 2000, "seed": seed}
    if method == "defaults":
        fleet = [
            VirtualDevice(
                f"dev-{i}", rate=r, initial=0, policy=POLICY_TRUNCATION, capacity=TRUNCATION_CAP
            )
            for i, r in enumerate(rate_list)
        ]
        return fleet, RunSettings(num_rounds=100_000, **harness)
    scadles = method.startswith("scadles")
    if scadles:
        b = int(method.removeprefix("scadles-")) // DEVICES if "-" in method else PAPER_BATCH
    else:
        b = int(method.removeprefix("fixed-"))
    fleet = [
        VirtualDevice(
            f"dev-{i}",
            rate=r,
            initial=0,
            policy=POLICY_TRUNCATION if scadles else POLICY_PERSISTENCE,
            capacity=TRUNCATION_CAP if scadles else PERSISTENCE_CAP,
        )
        for i, r in enumerate(rate_list)
    ]
    settings = RunSettings(
        num_rounds=100_000,  # the declared run length ends it
        local_steps=LOCAL_STEPS,
        global_batch=DEVICES * b,
        b_min=min(8, b),
        b_max=DEVICES * b,
        controller="dynamic" if scadles else "fixed",
        wait_policy="adapt" if scadles else "wait",
        availability_cap=scadles,
        aggregation="fedavg",  # ScaDLES weighs updates by the samples they used
        lr_batch=0,  # ... and scales the rate by sum(b) / B
        controller_probe=0,  # equal speeds: nothing to probe
        **harness,
    )
    return fleet, settings


def run(quick: bool = False) -> common.Result:
    """Every fixed batch and ScaDLES on each rate set, over the seeds."""
    seeds = common.SEEDS[:1] if quick else common.SEEDS
    cost = measure_step_time()
    methods = [f"fixed-{b}" for b in FIXED_BATCHES] + [
        "scadles",
        f"scadles-{DEVICES * 8}",
        "defaults",
    ]
    lengths = {k: v * (QUICK_FRACTION if quick else 1.0) for k, v in RUN_S.items()}
    runs: dict[tuple[str, str, int], common.FleetRun] = {}
    drawn: dict[str, dict[int, list[float]]] = {}
    changed: dict[str, dict[str, Any]] = {}  # method -> the run-config keys it changes
    for seed in seeds:
        for rate_set in RATE_SETS:
            drawn.setdefault(rate_set, {})[seed] = rates(rate_set, seed)
            for method in methods:
                fleet, settings = _arm(method, drawn[rate_set][seed], seed)
                changed[method] = common.changed_settings(settings)
                runs[(rate_set, method, seed)] = common.run_fleet(
                    f"streams {rate_set} {method} seed {seed}",
                    fleet,
                    settings,
                    seed,
                    until_s=lengths[rate_set],
                    step_time=cost.noisy(seed),
                )
    entries = _entries(runs, drawn, lengths, seeds, methods)
    for e in entries:
        e["settings"] = changed[e["method"]]
    goals = _goals(entries)
    table = _table(entries) + common.footnote(
        f"{DEVICES} devices of equal speed, {LOCAL_STEPS} local steps; fixed-b: B = {DEVICES} "
        f"x b; scadles: B = {DEVICES * PAPER_BATCH}, scadles-{DEVICES * 8}: B = "
        f"{DEVICES * 8}; defaults: every run-config key at its default; truncation at "
        f"{TRUNCATION_CAP} samples for scadles and defaults; each row's run-config changes in "
        "its settings column (the benchmark also sets num-rounds, ended by the run length, "
        "eval-data and the seed); every arm at the default learning rate (0.05), ScaDLES' "
        "scaled by sum(b)/B when streams cap it, the defaults' by sum(b)/lr-batch below "
        f"lr-batch. Run lengths (virtual): "
        + ", ".join(f"{k} {v:.0f} s" for k, v in lengths.items())
        + f". Seeds {', '.join(map(str, seeds))}: figures are mean (min-max). A time to "
        f"{TARGET_ACCURACY:g} counts once held for two evaluations; 'best fixed' is the fixed "
        "batch with the shortest mean time to target on that rate set (accuracy at the end "
        "breaks ties among those that never reach it). Buffers in samples, measured before "
        "each round's training, peak over devices and rounds; dropped = samples the policy "
        f"discarded over the run / samples that arrived. Compute: {cost.describe()}",
        goals["text"],
    )
    meta = {
        "quick": quick,
        "seeds": list(seeds),
        "run_s": lengths,
        "rates": {k: {str(s): r for s, r in v.items()} for k, v in drawn.items()},
        "goals": goals,
    }
    return common.Result("streams", entries, table, meta, [lambda out: _plot(runs, seeds[0], out)])


def _entries(
    runs: dict[tuple[str, str, int], common.FleetRun],
    drawn: dict[str, dict[int, list[float]]],
    lengths: dict[str, float],
    seeds: tuple[int, ...],
    methods: list[str],
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for rate_set in RATE_SETS:
        length = lengths[rate_set]
        for method in methods:
            per: dict[str, list[Any]] = {k: [] for k in ("ttt", "acc", "peak", "dropped", "rounds")}
            for seed in seeds:
                out = runs[(rate_set, method, seed)]
                per["ttt"].append(common.time_to_target(out.records, TARGET_ACCURACY))
                per["acc"].append(_accuracy_at(out, length))
                per["peak"].append(max(f for rnd in out.fill_log for f in rnd.values()))
                arrived = sum(b["arrived"] for b in out.buffers.values())
                per["dropped"].append(
                    sum(b["dropped"] for b in out.buffers.values()) / max(1, arrived)
                )
                per["rounds"].append(len(rounds_only(out.records)))
            rate_lists = drawn[rate_set].values()
            entries.append(
                {
                    "rate_set": rate_set,
                    "method": method,
                    "run_s": length,
                    "rate_min": min(min(r) for r in rate_lists),
                    "rate_max": max(max(r) for r in rate_lists),
                    **{f"{k}_per_seed": v for k, v in per.items()},
                    "time_to_target_s": common.mean_or_none(per["ttt"]),
                    "accuracy_at_end": common.mean_or_none(per["acc"]),
                    "curve_seed0": [
                        r.test_accuracy
                        for r in rounds_only(runs[(rate_set, method, seeds[0])].records)
                    ],
                }
            )
    for rate_set in RATE_SETS:
        rows = {e["method"]: e for e in entries if e["rate_set"] == rate_set}
        best = min(
            (e for m, e in rows.items() if m.startswith("fixed")),
            key=lambda e: (
                e["time_to_target_s"] is None,
                e["time_to_target_s"] or 0.0,
                -(e["accuracy_at_end"] or 0.0),
            ),
        )
        for s in (e for m, e in rows.items() if not m.startswith("fixed")):
            _compare(s, rows[f"fixed-{PAPER_BATCH}"], best)
    return entries


def _compare(s: dict[str, Any], paper: dict[str, Any], best: dict[str, Any]) -> None:
    """A ScaDLES row against ScaDLES' own baseline (fixed-64) and the best fixed batch."""
    s["best_fixed"] = best["method"]
    for name, ref in (("paper", paper), ("best", best)):
        s[f"speedup_vs_{name}_per_seed"] = [
            t_b / t_s if t_b and t_s else None
            for t_b, t_s in zip(ref["ttt_per_seed"], s["ttt_per_seed"], strict=True)
        ]
        s[f"speedup_vs_{name}"] = common.mean_or_none(s[f"speedup_vs_{name}_per_seed"])
        s[f"accuracy_delta_vs_{name}_per_seed"] = [
            a_s - a_b for a_b, a_s in zip(ref["acc_per_seed"], s["acc_per_seed"], strict=True)
        ]
        s[f"accuracy_delta_vs_{name}"] = common.mean_or_none(
            s[f"accuracy_delta_vs_{name}_per_seed"]
        )
    s["buffer_reduction_per_seed"] = [
        p_b / max(1, p_s)
        for p_b, p_s in zip(paper["peak_per_seed"], s["peak_per_seed"], strict=True)
    ]
    s["buffer_reduction"] = common.mean_or_none(s["buffer_reduction_per_seed"])


def _accuracy_at(out: common.FleetRun, seconds: float) -> float:
    """The last evaluated accuracy at or before ``seconds`` of virtual time."""
    clock, acc = 0.0, 0.0
    for r in out.records:
        clock += r.virtual_s
        if clock > seconds + 1e-9:
            break
        acc = r.test_accuracy
    return acc


def _table(entries: list[dict[str, Any]]) -> str:
    rows = []
    for e in entries:
        scadles = not e["method"].startswith("fixed")
        rows.append(
            [
                e["rate_set"],
                e["method"] + (f" (best fixed: {e['best_fixed']})" if scadles else ""),
                common.describe_settings(e["settings"]),
                f"{e['rate_min']:.0f}-{e['rate_max']:.0f}",
                f"{e['run_s']:.0f} s",
                common.spread(e["rounds_per_seed"], "{:.0f}"),
                common.spread(e["ttt_per_seed"], "{:.0f}"),
                common.spread(e["acc_per_seed"], "{:.3f}"),
                common.spread(e["peak_per_seed"], "{:,.0f}"),
                common.spread([d * 100 for d in e["dropped_per_seed"]], "{:.1f}") + " %",
                common.spread(e["speedup_vs_best_per_seed"]) if scadles else "-",
                common.spread(e["speedup_vs_paper_per_seed"]) if scadles else "-",
                common.spread(e["buffer_reduction_per_seed"], "{:.1f}") if scadles else "-",
            ]
        )
    return common.markdown_table(
        [
            "rate set",
            "method",
            "settings",
            "rates/s",
            "run length",
            "rounds",
            f"time to {TARGET_ACCURACY:g} (s)",
            "accuracy at the end",
            "peak buffer",
            "dropped",
            "speedup vs best fixed",
            f"vs fixed-{PAPER_BATCH}",
            f"peak buffer vs fixed-{PAPER_BATCH}",
        ],
        rows,
    )


def _goals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """ScaDLES' goals for its own arm (``scadles``), each judged in every seed
    (:func:`~deploy.bench.common.every_seed`)."""
    s1p = next(e for e in entries if e["rate_set"] == "S1p" and e["method"] == "scadles")
    best, paper = s1p["speedup_vs_best_per_seed"], s1p["speedup_vs_paper_per_seed"]
    delta = s1p["accuracy_delta_vs_best_per_seed"]
    reductions = [
        min(values)
        for values in zip(
            *(e["buffer_reduction_per_seed"] for e in entries if e["method"] == "scadles"),
            strict=True,
        )
    ]
    met = {
        "speedup": common.every_seed(best, lambda v: v >= GOALS["speedup_S1p"]),
        "accuracy": common.every_seed(delta, lambda v: v >= -GOALS["accuracy_points"]),
        "buffer": common.every_seed(reductions, lambda v: v >= GOALS["buffer_reduction"]),
    }
    text = (
        f"in every seed: speedup >= 3.29x on S1p against the best fixed batch: {_xs(best)} "
        f"({common.verdict(met['speedup'])}; against ScaDLES' fixed-{PAPER_BATCH}: "
        f"{_xs(paper)}); accuracy at the end of the run within 1 point of the best fixed batch: "
        + "/".join(f"{d * 100:+.1f}" for d in delta)
        + f" pt ({common.verdict(met['accuracy'])}); "
        f"peak buffer >= 100x smaller than fixed-{PAPER_BATCH} with persistence (smallest over "
        "the sets, at these run lengths): "
        + "/".join(f"{r:.1f}x" for r in reductions)
        + f" ({common.verdict(met['buffer'])})"
    )
    return {"met": met, "text": text}


def _xs(values: list[float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.2f}x" for v in values)


def _plot(runs: dict[tuple[str, str, int], common.FleetRun], seed: int, out: Path) -> Path:
    def draw(axes: list[Axes]) -> None:
        for (rate_set, method, s), run_ in runs.items():
            if s != seed or method not in ("scadles", f"fixed-{PAPER_BATCH}", "fixed-8"):
                continue
            clock = np.cumsum([r.virtual_s for r in run_.records])
            style = "-" if method == "scadles" else "--" if method == "fixed-8" else ":"
            label = f"{rate_set} {method}"
            axes[0].plot(clock, [r.test_accuracy for r in run_.records], style, label=label)
            axes[1].plot(clock, [max(f.values()) for f in run_.fill_log], style, label=label)

    panels = [
        common.Panel("virtual seconds", "accuracy", xscale="log"),
        common.Panel("virtual seconds", "largest buffer (samples)", xscale="log", yscale="log"),
    ]
    return common.save_figure(out / "streams.png", panels, draw)
