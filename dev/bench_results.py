"""The ``## Results`` block of ``docs/benchmarks.md``, rendered from ``bench/results/*.json``.

One bullet per benchmark, each made by a function named for it (:func:`hetero`,
:func:`streams`, ...; the wall-clock benchmarks' in ``dev/bench_results_wall.py``) from that
benchmark's JSON document (and any other that :data:`BULLETS` names beside it), so that
every figure on the page can be traced to the key it is formatted from; a key a function
needs and the JSON lacks raises (``KeyError``), nothing is made up. The papers' headline
figures beside ours (OmniLearn's 14-85 %, ScaDLES' 3.29x and 848-9429x, FedBuff's 3.3x,
DGC's 270-600x, top-k's 60-78x) are citations, typed here as text; goals' thresholds come
from the scenario modules of :mod:`deploy.bench` (settings, not results), or are named
beside the bullets where the scenario keeps none (``bench_results_wall.ROUND_GOAL``,
``PI_FREE_GOAL``). How figures are written: ``dev/bench_format.py``.

:func:`render` reads the folder and joins the bullets; ``dev/bench_tables.py`` puts them
between ``<!-- bench:results -->`` and ``<!-- /bench:results -->``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench_format import (
    Doc,
    bullet,
    fmt_pct,
    fmt_points,
    fmt_seeds,
    fmt_spread,
    fmt_verdict,
    fmt_x,
    one_entry,
)
from bench_results_wall import (
    PI_FREE_GOAL,
    ROUND_GOAL,
    agent,
    bursts,
    deployment,
    footprint,
    idle_fleet,
    inference,
    reliability,
    scale,
    service,
)

__all__ = [
    "BULLETS",
    "PI_FREE_GOAL",
    "ROUND_GOAL",
    "agent",
    "asynchronous",
    "buffers",
    "bursts",
    "changed_sources",
    "compression",
    "controller_defaults",
    "deployment",
    "drift",
    "footprint",
    "forecast",
    "hetero",
    "idle_fleet",
    "inference",
    "label_skew",
    "noniid",
    "people",
    "privacy",
    "reliability",
    "render",
    "scale",
    "secagg",
    "sections",
    "service",
    "stale",
    "staleness",
    "streams",
]


# -- the bullets of the virtual-clock benchmarks (and forecasting, drift) -----------------


def hetero(doc: Doc) -> str:
    """OmniLearn's batch control at the run-config defaults (``hetero.json``).

    Reads ``defaults``, ``achievable`` and ``seeds``; per goal scenario's ``dynamic`` entry
    ``settings``, ``reduction_per_seed``, ``of_achievable_per_seed``,
    ``reduction_overhead_per_seed``, ``steady_efficiency_per_seed``,
    ``final_vs_fixed_per_seed`` and ``target_accuracy``; the schedule's
    ``periods_to_balance``; ``HL8-K1``'s ``reduction_per_seed`` and ``settings``;
    ``flower_round_s`` and ``goals.met``.
    """
    from deploy.bench.hetero import GOAL_SCENARIOS, GOAL_SHARE, GOAL_STEADY, STEADY_LEVELS

    entries, room, d = doc["entries"], doc["achievable"], doc["defaults"]
    dyn = {sc: one_entry(entries, level=sc, arm="dynamic") for sc in GOAL_SCENARIOS}
    for sc, e in dyn.items():
        if e["settings"]:
            raise ValueError(f"hetero's {sc} dynamic row is not at the defaults: {e['settings']}")
    met = doc["goals"]["met"]

    def where(sc: str) -> str:
        return "with the straggler" if sc == "straggler" else f"at {sc}"

    def per(key: str, fmt: Callable[[Sequence[float | None]], str], scs: Sequence[str]) -> str:
        return ", ".join(f"{fmt(dyn[sc][key])} {where(sc)}" for sc in scs)

    cuts = ", ".join(
        f"{fmt_pct(dyn[sc]['reduction_per_seed'])} {where(sc)} (achievable "
        f"{100 * room[sc]['reduction']:.0f} %: {fmt_verdict(met['of_achievable'][sc])})"
        for sc in GOAL_SCENARIOS
    )
    missed = _hetero_missed(entries, dyn, met["of_achievable"], GOAL_SHARE)
    steady = "; ".join(f"{lv} {fmt_verdict(met['steady'][lv])}" for lv in STEADY_LEVELS)
    final = "; ".join(f"{sc} {fmt_verdict(met['final'][sc])}" for sc in GOAL_SCENARIOS)
    periods = one_entry(entries, level="schedule", arm="dynamic")["periods_to_balance"]
    k1 = one_entry(entries, level="HL8-K1", arm="dynamic")
    k1_settings = ", ".join(f"{k} {v:g}" for k, v in k1["settings"].items())
    return bullet(
        f"""**Per-device batch control on heterogeneous workers** (OmniLearn: 14-85 % less
        training time): virtual clock, 4 devices, {fmt_seeds(doc["seeds"])}, every arm at the
        run-config defaults (B = {d["global-batch"]}, b in [{d["b-min"]}, {d["b-max"]}],
        aggregation `{d["aggregation"]}`, controller-probe {d["controller-probe"]}); times
        to {dyn["HL2"]["target_accuracy"]:g} count from virtual time 0, the timing probe, each
        message's model download and update upload, and the aggregator's work charged. The
        dynamic controller takes {cuts} less time than the fixed split (goal: at least
        {GOAL_SHARE:g} x the achievable in every seed; achievable = the best split's cut of
        the slowest device's round on the step-time line){missed}; with Flower's measured per-round
        orchestration ({doc["flower_round_s"]:.1f} s, `flower_round_s`) added to every
        exchange: {per("reduction_overhead_per_seed", fmt_pct, GOAL_SCENARIOS)}. Steady
        rounds (after round 3) against the achievable split:
        {per("steady_efficiency_per_seed", fmt_spread, STEADY_LEVELS)} (goal >=
        {GOAL_STEADY:g}: {steady}); final accuracy against the fixed split's:
        {per("final_vs_fixed_per_seed", fmt_points, GOAL_SCENARIOS)} (goal: at most 1 point
        below: {final}). The defaults leave room: achievable
        {100 * room["HL4"]["reduction"]:.0f} % at HL4, {100 * room["HL8"]["reduction"]:.0f} %
        at HL8 (goals 30 % and 50 %: {fmt_verdict(met["room"]["HL4"])},
        {fmt_verdict(met["room"]["HL8"])}). Rebalanced within {periods} controller periods of
        each speed switch ({fmt_verdict(met["rebalance"])}); the papers' K = 1 at HL8
        ({k1_settings}): {fmt_pct(k1["reduction_per_seed"])} less time. `fedstream bench
        hetero`."""
    )


def _hetero_missed(
    entries: Sequence[Doc], dyn: dict[str, Doc], met: dict[str, bool], share: float
) -> str:
    """Where the dynamic arm's cut missed its share of the achievable: the seeds, and the
    rounds each arm took to the target there (a round more or less moves a cut by about a
    tenth of the achievable at HL2)."""
    parts = []
    for sc, ok in met.items():
        if ok:
            continue
        fixed = one_entry(entries, level=sc, arm="fixed")
        seeds = [
            f"seed {seed}: {r_d} rounds against the fixed split's {r_f}"
            for seed, v, r_d, r_f in zip(
                dyn[sc]["seeds"],
                dyn[sc]["of_achievable_per_seed"],
                dyn[sc]["rounds_per_seed"],
                fixed["rounds_per_seed"],
                strict=True,
            )
            if v is None or v < share
        ]
        parts.append(f"{sc} missed in {', '.join(seeds)}")
    if not parts:
        return ""
    return (
        " (" + "; ".join(parts) + ", while its steady rounds held their share: the target "
        "sits where the curves flatten, and a seed's arms cross it rounds apart)"
    )


def streams(doc: Doc) -> str:
    """ScaDLES' rate-aware batches against fixed ones (``streams.json``).

    Reads the ``scadles``, ``scadles-64`` and ``defaults`` entries of each rate set:
    ``speedup_vs_paper_per_seed``, ``speedup_vs_best_per_seed``, ``best_fixed``,
    ``accuracy_delta_vs_best_per_seed`` and ``settings``; ``seeds``, ``goals.met``.
    """
    from deploy.bench.streams import DEVICES, GOALS, PAPER_BATCH, TARGET_ACCURACY

    entries = doc["entries"]
    sets = list(doc["run_s"])
    s = {rs: one_entry(entries, rate_set=rs, method="scadles") for rs in sets}
    s64 = {rs: one_entry(entries, rate_set=rs, method=f"scadles-{DEVICES * 8}") for rs in sets}
    ours = {rs: one_entry(entries, rate_set=rs, method="defaults") for rs in sets}
    if any(e["settings"] for e in ours.values()):
        raise ValueError("streams' defaults row changes run-config keys")
    paper = ", ".join(f"{k} = {v}" for k, v in s[sets[0]]["settings"].items())

    def per_set(rows: dict[str, Doc], key: str, fmt: Callable[..., str] = fmt_x) -> str:
        return ", ".join(f"{rs} {fmt(rows[rs][key])}" for rs in sets)

    b8 = [rs for rs in sets if s64[rs]["best_fixed"] == "fixed-8"]
    others = ", ".join(f"{rs}: {s64[rs]['best_fixed']}" for rs in sets if rs not in b8)
    met = doc["goals"]["met"]
    reason = ""
    if not met["speedup"] and s["S1p"]["best_fixed"] == "fixed-8":
        reason = (
            ": the best fixed batch, 8 per device, waits for as many samples as ScaDLES' "
            "`adapt` does at b-min 8, so both run as many rounds, and at B = "
            f"{DEVICES * PAPER_BATCH} ScaDLES then trains at a learning rate cut by sum(b)/B"
        )
    return bullet(
        f"""**Rate-aware streaming training** (ScaDLES: up to 3.29x faster convergence):
        virtual clock, {DEVICES} devices of equal speed, {fmt_seeds(doc["seeds"])}, time to
        {TARGET_ACCURACY:g}; goals judged in every seed. Against ScaDLES' baseline (fixed
        {PAPER_BATCH} per device), `scadles` ({paper}) is {per_set(s, "speedup_vs_paper_per_seed")}
        faster; against the best fixed batch {per_set(s, "speedup_vs_best_per_seed")} (goal
        >= {GOALS["speedup_S1p"]:g}x on S1p: {fmt_verdict(met["speedup"])}{reason}).
        `scadles-{DEVICES * 8}` runs at B = {DEVICES * 8}, the global batch of fixed-8, the
        best fixed arm on {", ".join(b8) or "no rate set"}{f" ({others})" if others else ""}:
        its {per_set(s64, "speedup_vs_paper_per_seed")} over fixed-{PAPER_BATCH} is that batch
        size, not rate awareness; against the best fixed batch it is
        {per_set(s64, "speedup_vs_best_per_seed")}. Accuracy at the end, `scadles` against
        the best fixed batch: {per_set(s, "accuracy_delta_vs_best_per_seed", fmt_points)} (goal:
        within {100 * GOALS["accuracy_points"]:g} point on S1p: {fmt_verdict(met["accuracy"])}).
        fedstream at its run-config defaults against the best fixed batch:
        {per_set(ours, "speedup_vs_best_per_seed")}, accuracy at the end
        {per_set(ours, "accuracy_delta_vs_best_per_seed", fmt_points)}. `fedstream bench
        streams`."""
    )


def buffers(doc: Doc) -> str:
    """Truncation's buffers against persistence's (``streams.json``).

    Reads the ``scadles`` entries' ``buffer_reduction_per_seed``, ``dropped_per_seed`` and
    ``peak_per_seed``, ``run_s`` and ``goals.met.buffer``.
    """
    from deploy.bench.streams import GOALS, PAPER_BATCH

    entries = doc["entries"]
    sets = list(doc["run_s"])
    s = {rs: one_entry(entries, rate_set=rs, method="scadles") for rs in sets}
    reduction = ", ".join(
        f"{rs} {fmt_spread(s[rs]['buffer_reduction_per_seed'], '{:.1f}x')}" for rs in sets
    )
    dropped = ", ".join(f"{rs} {fmt_pct(s[rs]['dropped_per_seed'])}" for rs in sets)
    peak = max(max(s[rs]["peak_per_seed"]) for rs in sets)
    lengths = ", ".join(f"{rs} {v:,.0f} s" for rs, v in doc["run_s"].items())
    met = doc["goals"]["met"]["buffer"]
    reason = (
        ""
        if met
        else ": persistence keeps every sample until consumed, so its peak grows with the "
        "run's length (fast streams fill while a round waits for the slowest), and the ratio "
        "with it"
    )
    return bullet(
        f"""**Truncation vs persistence buffers** (ScaDLES: 848-9429x smaller): virtual
        clock, the same runs ({lengths} of virtual time): `scadles`' peak buffer (truncation,
        at most {peak:,} samples) is {reduction} smaller than fixed-{PAPER_BATCH}'s
        (persistence; goal >= {GOALS["buffer_reduction"]:g}x: {fmt_verdict(met)}{reason}), at
        the cost of the arrivals truncation drops: {dropped}. `fedstream bench streams`."""
    )


def _room(doc: Doc, transfer_s: float) -> str:
    """The best split's cut of the slowest device's round (``Achievable``) on ``doc``'s
    ``step-cost`` line, with ``transfer_s`` of model transfers a round: what the global batch
    and the batch bounds leave the controller, the reason for their defaults."""
    from deploy.bench.common import StepCost
    from deploy.bench.hetero import Achievable, slowdowns
    from edge_client.wire.run_config import RunSettings

    line = doc["step-cost"]
    cost = StepCost(line["a"], line["c"], {}, line["sigma"])

    def cut(scenario: str, **keys: int) -> str:
        room = Achievable(slowdowns(scenario), cost, RunSettings(**keys), transfer_s)
        return f"{100 * room.reduction:.0f} %"

    batches = ", ".join(
        f"B = {b} {cut('HL4', global_batch=b)} / {cut('HL8', global_batch=b)}"
        for b in (128, 256, 512)
    )
    return (
        f"The room the step-time line leaves (the best split's cut of the slowest device's "
        f"round: {line['a'] * 1e3:.3f} ms + {line['c'] * 1e6:.1f} us x b a step, and "
        f"{transfer_s * 1e3:.0f} ms of model transfers a round, as `bench hetero` charged "
        f"them), HL4 / HL8: {batches}; at B = 512, b-min 4 {cut('HL8', b_min=4)} at HL8 and "
        f"{cut('straggler', b_min=4)} with the straggler (b-min 8: "
        f"{cut('straggler')}), b-min 16 {cut('HL8', b_min=16)} at HL8, b-max 256 "
        f"{cut('HL8', b_max=256)} at HL8."
    )


def controller_defaults(doc: Doc, hetero_doc: Doc) -> str:
    """What chose the controller's and the aggregation's defaults (``defaults.json``, and
    ``hetero.json``'s ``transfer_s`` for the room the line leaves).

    Reads, per scenario, the entries' ``reduction_per_seed``, ``ttt_per_seed``, ``reached``,
    ``steady_per_seed``, ``final_per_seed`` and ``target``; ``old-defaults``, ``step-cost``
    and ``seeds``.
    """
    from deploy.bench.defaults import IID_SCENARIOS

    entries = doc["entries"]

    def cut(arm: str) -> str:
        return ", ".join(
            f"{sc} {fmt_pct(one_entry(entries, scenario=sc, arm=arm)['reduction_per_seed'])}"
            for sc in IID_SCENARIOS
        )

    def held(arm: str) -> str:
        e = one_entry(entries, scenario="skew-HL8", arm=arm)
        return f"`{arm}` {e['reached']} of {len(e['seeds'])}"

    def stream_time(arm: str) -> str:
        times = one_entry(entries, scenario="streams-S2", arm=arm)["ttt_per_seed"]
        text = fmt_spread(times)
        return text if all(t is None for t in times) else f"{text} s"  # "none of 3 seeds"

    def versus(arm: str, ref: str) -> str:
        """``arm``'s time to the target against ``ref``'s, per seed, as a cut."""
        return ", ".join(
            f"{sc} "
            + fmt_pct(
                [
                    None if a is None or b is None else 1 - a / b
                    for a, b in zip(
                        one_entry(entries, scenario=sc, arm=arm)["ttt_per_seed"],
                        one_entry(entries, scenario=sc, arm=ref)["ttt_per_seed"],
                        strict=True,
                    )
                ]
            )
            for sc in IID_SCENARIOS
        )

    old = ", ".join(f"{k} {v}" for k, v in doc["old-defaults"].items())
    skew_target = one_entry(entries, scenario="skew-HL8", arm="dynamic")["target"]
    return bullet(
        f"""**Choosing the defaults**: virtual clock, 4 devices, {fmt_seeds(doc["seeds"])}; the
        dynamic controller's cut in time to 0.85 against the fixed split of its own starting
        point. At the previous defaults ({old}): {cut("old dynamic")}; with the adaptive
        weights alone {cut("old + adaptive")}; with B = 512 alone {cut("old + B 512")}; at
        this release's defaults {cut("dynamic")} (with `fednova` {cut("fednova")}, with
        `fedavg` {cut("fedavg")}). A larger global batch at the same learning rate learns less
        per sample: against the previous defaults' fixed split (B = 128, the faster of the two
        fixed splits everywhere), this release's defaults take {versus("dynamic", "old fixed")}
        less time. One label per device at HL8, target {skew_target:g} held:
        {held("dynamic")} (`adaptive`), {held("fednova")}, {held("fedavg")}, {held("fixed")}
        seeds, and at lr 0.1 {held("lr 0.1")}. On S2 streams that cap the batches, time to
        0.85: {stream_time("dynamic")} at the defaults, {stream_time("lr-batch 0")} with
        the rate scaled by sum(b) / B, {stream_time("old dynamic")} at the previous
        defaults. {_room(doc, hetero_doc["transfer_s"])} `fedstream bench defaults`."""
    )


def label_skew(doc: Doc) -> str:
    """Aggregation rules under label skew at HL8 (``hetero.json``).

    Reads the ``skew-HL8`` entries' ``final_per_seed``, ``ttt_per_seed``, ``settings``
    and ``target_accuracy``, the ``iid-HL8`` entries' ``ttt_per_seed``, ``rounds_per_seed``
    and ``target_accuracy``, ``defaults`` and ``goals.met.skew``.
    """
    from deploy.bench.hetero import SKEW_RULES

    entries, default = doc["entries"], doc["defaults"]["aggregation"]
    arms = ("fixed", *(f"dynamic/{rule}" for rule in SKEW_RULES))
    skew = {arm: one_entry(entries, level="skew-HL8", arm=arm) for arm in arms}
    iid = {arm: one_entry(entries, level="iid-HL8", arm=arm) for arm in arms[1:]}

    def held(e: Doc) -> str:
        got = sum(t is not None for t in e["ttt_per_seed"])
        return f"held {e['target_accuracy']:g} in {got} of {len(e['ttt_per_seed'])} seeds"

    def name(arm: str) -> str:
        if arm == "fixed":
            return "the fixed split"
        rule = arm.split("/")[1]
        said = " (the default)" if rule == default else ""
        return f"the dynamic controller with `{rule}`{said}"

    final = "; ".join(
        f"{name(arm)} {fmt_spread(e['final_per_seed'], '{:.3f}')}, {held(e)}"
        for arm, e in skew.items()
    )
    times = ", ".join(
        f"`{arm.split('/')[1]}` {fmt_spread(e['ttt_per_seed'])} s "
        f"({fmt_spread(e['rounds_per_seed'], '{:.0f}')} rounds)"
        for arm, e in iid.items()
    )
    target = iid[arms[1]]["target_accuracy"]
    return bullet(
        f"""**Heterogeneity with label skew**: virtual clock, HL8, one of
        {skew["fixed"]["settings"]["num-classes"]} classes per device (`num-classes`, with the
        aggregation rule each row names, the rows' only changes from the defaults),
        {fmt_seeds(doc["seeds"])}: final accuracy (mean of the last rounds)
        of {final}; the default holds the target in every seed:
        {fmt_verdict(doc["goals"]["met"]["skew"])}. On IID streams, time to {target:g}: {times}.
        `fedstream bench hetero`."""
    )


def noniid(doc: Doc) -> str:
    """ScaDLES' data injection against one-label streams (``noniid.json``).

    Reads ``goal.partitions`` (``one-label``: ``delivered_bytes_per_round``,
    ``delivered_updates_per_round``, ``delivered_of_model_traffic``, ``inject_seeds_met``,
    ``seeds``, ``bytes_met``; ``one-label-digits``:
    ``inject_iid_fraction``, ``fedavg_iid_fraction``) and the one-label entries'
    ``iid_fraction_per_seed``, ``queued_bytes_per_round_per_seed`` and ``model_update_bytes``.
    """
    from deploy.bench.noniid import DEVICES, GOAL_INJECT, GOAL_METHOD

    entries = doc["entries"]
    goal = doc["goal"]["partitions"]
    one, digits = goal["one-label"], goal["one-label-digits"]
    inj = one_entry(entries, partition="one-label", method=GOAL_METHOD)
    avg = one_entry(entries, partition="one-label", method="fedavg")
    queued = statistics.mean(inj["queued_bytes_per_round_per_seed"])
    update = inj["model_update_bytes"]
    reason = ""
    if not one["bytes_met"] and queued < update:
        reason = (
            f": what the picked devices send up, {queued:,.0f} B a round, is under one update "
            f"({update:,} B); the broker's fan-out to every other opted-in device makes the rest"
        )
    return bullet(
        f"""**Data injection against non-IID streams** (ScaDLES: (0.25, 0.25) recovers most
        IID accuracy): in-process runner (accuracies per round and bytes from the frames, so
        nothing depends on the virtual clock), {DEVICES} devices, one label per device,
        {fmt_seeds(doc["seeds"])}: final accuracy {fmt_spread(inj["iid_fraction_per_seed"])} of the
        IID reference's with injection against {fmt_spread(avg["iid_fraction_per_seed"])} with
        FedAvg (goal >= {GOAL_INJECT:g} of IID in every seed:
        {fmt_verdict(one["inject_seeds_met"] == one["seeds"])},
        {one["inject_seeds_met"]} of {one["seeds"]} seeds); injection delivered
        {one["delivered_bytes_per_round"]:,.0f} B per round =
        {one["delivered_updates_per_round"]:.1f} model updates,
        {one["delivered_of_model_traffic"]:.2f} of the round's model traffic (goal < 1 update:
        {fmt_verdict(one["bytes_met"])}{reason}); digits, one digit per device:
        {digits["inject_iid_fraction"]:.2f} of IID against {digits["fedavg_iid_fraction"]:.2f}.
        `fedstream bench noniid`."""
    )


def compression(doc: Doc) -> str:
    """Compressed updates on two models (``compression.json``).

    Reads, per model (``models``: ``model``, ``parameters``) and mode, ``ratio_per_seed``,
    ``accuracy_delta_per_seed`` (the goal judged on them in every seed) and ``goal``, and
    ``bytes_both_to_target_per_seed`` of the large model's ``none``, ``topk-1%`` and
    ``topk-1%+fp16-down``; ``target_accuracy``, ``seeds``.
    """
    entries = doc["entries"]
    small, large = (m["model"] for m in doc["models"])

    def mode(model: str, name: str) -> str:
        e = one_entry(entries, model=model, mode=name)
        return f"{fmt_x(e['ratio_per_seed'], '{:.1f}')} fewer bytes up at " + fmt_points(
            e["accuracy_delta_per_seed"]
        )

    from deploy.bench.compression import goal_met

    def goal(name: str) -> str:  # judged in every seed, from the per-seed figures
        rows = [one_entry(entries, model=m, mode=name) for m in (small, large)]
        return f"goal {rows[0]['goal']}, every seed: " + ", ".join(
            fmt_verdict(bool(goal_met(r))) for r in rows
        )

    def both(name: str) -> float:
        per_seed: list[float] = one_entry(entries, model=large, mode=name)[
            "bytes_both_to_target_per_seed"
        ]
        return statistics.mean(per_seed)

    none = both("none")
    size = {m["model"]: f"{m['parameters']:,}-parameter" for m in doc["models"]}
    return bullet(
        f"""**Compressed updates** (top-k 1 % + coding: 60-78x; DGC 270-600x): in-process
        runner, virtual clock, {fmt_seeds(doc["seeds"])}: top-k 1 % with error feedback sends
        {mode(small, "topk-1%")} on the {size[small]} CNN, {mode(large, "topk-1%")}
        on the {size[large]} MLP ({goal("topk-1%")}); int8 {mode(small, "int8")} /
        {mode(large, "int8")} ({goal("int8")}). With the model going down to every device,
        top-k 1 % cuts the {size[large]} model's bytes both ways to {doc["target_accuracy"]:g}
        by {none / both("topk-1%"):.2f}x ({none / both("topk-1%+fp16-down"):.2f}x with an fp16
        broadcast). `fedstream bench compression`."""
    )


def forecast(doc: Doc) -> str:
    """Forecasting an unlabelled stream (``forecast.json``).

    Reads ``past``, ``horizon``, ``devices``, ``rounds``, ``seeds``, ``naive_mae``,
    ``ridge_mae``, ``goals_met`` and the federated entry's ``mae_per_seed``,
    ``lower_than_naive_per_seed`` and ``vs_ridge_per_seed``.
    """
    from deploy.bench.forecast import GOAL_VS_NAIVE, GOAL_VS_RIDGE

    fed = next(e for e in doc["entries"] if "mae_per_seed" in e)
    met = doc["goals_met"]
    return bullet(
        f"""**Forecasting an unlabelled stream**: weekly Mauna Loa CO2 1958-2001 (a real
        recording), {doc["past"]} weeks in, {doc["horizon"]} out, {doc["devices"]} devices,
        {doc["rounds"]} rounds, {fmt_seeds(doc["seeds"])}, the in-process runner, windows given
        directly (MAE does not depend on a clock): test MAE
        {fmt_spread(fed["mae_per_seed"], "{:.3f}")} ppmv,
        {fmt_pct(fed["lower_than_naive_per_seed"])}
        below the naive forecast's {doc["naive_mae"]:.3f} (goal >= {100 * GOAL_VS_NAIVE:.0f} %:
        {fmt_verdict(met["vs_naive"])}) and {fmt_x(fed["vs_ridge_per_seed"])} the ridge
        autoregression's {doc["ridge_mae"]:.3f}, which is fitted centrally and penalty-tuned
        (goal <= {GOAL_VS_RIDGE:g}x: {fmt_verdict(met["vs_ridge"])}). `fedstream bench
        forecast`."""
    )


def asynchronous(doc: Doc) -> str:
    """FedBuff against synchronous rounds (``async.json``).

    Reads the entries' ``time-to-target-s`` (as speedups over ``sync-dynamic`` and over the
    best synchronous arm, per seed), ``accuracy-at-horizon``, ``accuracy-last-quarter``,
    ``failed``, ``updates`` and ``settings``; ``deadline-tuning-seed``, ``deadline-factors``,
    ``deadline-chosen``, ``seeds`` and ``goals``.
    """
    from deploy.bench.asynchronous import (
        GOALS,
        STRAGGLER,
        UNIQUE_CLASSES,
        _select,
        _speedups,
        _vs_best_sync,
    )

    entries, goals, chosen = doc["entries"], doc["goals"], doc["deadline-chosen"]

    def speedup(name: str, method: str = "async") -> str:
        return fmt_x(_speedups(entries, name, method))

    def vs_best(name: str, method: str = "async") -> str:
        return fmt_x(_vs_best_sync(entries, name, method))

    from deploy.bench.asynchronous import METHODS

    changes = "; ".join(
        f"{method}: "
        + (
            ", ".join(
                f"{k} = {v}" for k, v in _select(entries, "HL8", method, "settings")[0].items()
            )
            or "defaults"
        )
        for method in METHODS
    )

    def accuracy(name: str, method: str, key: str = "accuracy-at-horizon") -> str:
        return fmt_spread(_select(entries, name, method, key), "{:.3f}")

    updates = {name: _select(entries, name, "sync-deadline", "updates") for name in chosen}
    cut = [
        f"{name} ({sum(u == 0 for u in up)} of {len(up)} seeds)"
        for name, up in updates.items()
        if 0 in up
    ]
    dropped = sum(_select(entries, "straggler-classes", "sync-deadline", "failed"))
    classes = goals["classes-beat-deadline"]
    reason = ""
    if not classes:
        reason = (
            f": the deadline tuned there, {chosen['straggler-classes']:g} x the median round, "
            + ("drops no reply, so it is sync-dynamic; " if dropped == 0 else "")
            + "in async the straggler's updates are rare and damped for their staleness"
        )
    factors = ", ".join(f"{f:g}" for f in doc["deadline-factors"])
    deadline = f"{speedup('straggler', 'sync-deadline')} with the straggler, "
    deadline += f"{speedup('HL8', 'sync-deadline')} at HL8"
    dropped_all = f"; the chosen deadline dropped every reply at {', '.join(cut)}" if cut else ""
    quarter = ", ".join(
        f"{m} {accuracy('straggler-classes', m, 'accuracy-last-quarter')}"
        for m in ("async", "sync-deadline")
    )
    return bullet(
        f"""**Asynchronous aggregation** (FedBuff: 3.3x faster than synchronous FedAvg;
        OmniLearn: up to +6.9 % accuracy in asynchronous training): virtual clock, 4 devices,
        {fmt_seeds(doc["seeds"])}, every method at the run-config defaults but its own keys
        ({changes}), times from virtual time 0 with the model's download to every
        message charged; each goal judged in every seed. With one device {STRAGGLER:g}x
        slower, async reaches the target
        {speedup("straggler")} sooner than sync-dynamic (goal >= {GOALS["straggler_speedup"]:g}x:
        {fmt_verdict(goals["straggler-speedup"])}) and ends at {accuracy("straggler", "async")}
        against {accuracy("straggler", "sync-dynamic")} at equal time (goal: within
        {100 * GOALS["straggler_points"]:g} point: {fmt_verdict(goals["straggler-accuracy"])});
        HL8 {speedup("HL8")} (goal >= 1x: {fmt_verdict(goals["hl8-as-fast"])}); HL2
        {speedup("HL2")}. Against the best synchronous arm of each seed (fixed, dynamic or
        deadline, whichever reached the target first): {vs_best("straggler")} with the
        straggler, {vs_best("HL8")} at HL8, {vs_best("HL4")} at HL4, {vs_best("HL2")} at HL2.
        Sync rounds with a deadline, tuned on seed
        {doc["deadline-tuning-seed"]}, which is not reported (tried: {factors} x sync-dynamic's
        median round; chosen {chosen["straggler"]:g} x with the straggler, {chosen["HL8"]:g} x
        at HL8), reach the target {deadline} sooner than sync-dynamic{dropped_all}. With the
        straggler alone holding classes {UNIQUE_CLASSES[0]} and {UNIQUE_CLASSES[1]}, mean
        accuracy over the last quarter: {quarter} (goal: async higher:
        {fmt_verdict(classes)}{reason}).
        `fedstream bench async`."""
    )


def drift(doc: Doc) -> str:
    """Drift detection and the fleet's reactions (``drift.json``).

    Reads the detector entry's ``false_alarms_per_100k`` and ``delay_windows``, and the fleet
    entries' ``changed``, ``reaction``, ``recovery_rounds``, ``mean_after_change``,
    ``detected`` and ``accuracy_changed_devices``; ``seeds``.
    """
    from deploy.bench.drift_recovery import CHANGE_ROUND, DEVICES, GOAL_DELAY, GOAL_FALSE_ALARMS

    detector = next(e for e in doc["entries"] if "detector" in e)
    fleet = [e for e in doc["entries"] if "changed" in e]
    alarms = max(max(v) for v in detector["false_alarms_per_100k"].values())
    rates = list(detector["false_alarms_per_100k"])
    delays = detector["delay_windows"]
    tripled = delays["0.1->0.3"]

    def of(changed: int, reaction: str) -> list[Doc]:
        return [e for e in fleet if e["changed"] == changed and e["reaction"] == reaction]

    def first_seen(e: Doc) -> int | None:
        """Rounds from the change until its last changed device reported it (None: one never
        did)."""
        found = [
            [int(r) for r, devs in e["detected"].items() if f"dev-{i}" in devs]
            for i in range(e["changed"])
        ]
        return None if not all(found) else max(min(f) for f in found) - CHANGE_ROUND

    lags = [first_seen(e) for e in fleet]
    if None in lags:
        seen = f"in {lags.count(None)} of {len(lags)} runs a changed device never reported it"
    else:
        lag = max(lag for lag in lags if lag is not None)
        when = "in the round the change began" if lag == 0 else f"within {lag} rounds after it"
        seen = f"every changed device reported it {when}"
    after = len(fleet[0]["accuracy_changed_devices"]) - CHANGE_ROUND + 1
    reactions = list(dict.fromkeys(e["reaction"] for e in fleet))

    def recovered(changed: int) -> str:
        rounds = {r: [e["recovery_rounds"] for e in of(changed, r)] for r in reactions}
        if all(v is None for runs in rounds.values() for v in runs):
            return f"not within the {after} rounds after it, with any reaction"

        def one(runs: list[int | None]) -> str:
            done = [v for v in runs if v is not None]
            if not done:
                return f"not within {after} rounds"
            if len(done) < len(runs):  # judged per seed: say how many recovered
                return (
                    f"in {fmt_spread(done, '{:.0f}')} rounds in {len(done)} of {len(runs)} "
                    f"seeds, not within {after} in the others"
                )
            return f"in {fmt_spread(done, '{:.0f}')} rounds"

        return ", ".join(f"{one(v)} (`{r}`)" for r, v in rounds.items())

    after_change = {
        r: statistics.mean(e["mean_after_change"] for e in of(DEVICES // 2, r)) for r in reactions
    }
    cost = ", ".join(
        f"`{r}` {round(100 * (v - after_change['none']), 1) + 0.0:+.1f}"  # never "-0.0"
        for r, v in after_change.items()
        if r != "none"
    )
    return bullet(
        f"""**Drift detection and reaction**: ADWIN ({detector["detector"].split()[-1]}) on 0/1
        errors, {fmt_seeds(doc["seeds"])}: at most {alarms} false alarms per 100,000 stationary
        windows at error rates {rates[0]}-{rates[-1]} (goal <= {GOAL_FALSE_ALARMS}:
        {fmt_verdict(alarms <= GOAL_FALSE_ALARMS)}); 0.1 -> 0.3 reported after
        {fmt_spread(tripled, "{:.0f}")} windows (goal <= {GOAL_DELAY}:
        {fmt_verdict(None not in tripled and max(tripled) <= GOAL_DELAY)}), 0.1 -> 0.5 after
        {fmt_spread(delays["0.1->0.5"], "{:.0f}")}. Sensors flipped mid-run (virtual clock,
        {DEVICES} devices): {seen}; the whole fleet flipped
        recovered {recovered(DEVICES)}; half of it {recovered(DEVICES // 2)}; there the
        reactions moved the changed devices' mean accuracy after the change by {cost} points
        against `none` (the default). `fedstream bench drift`."""
    )


def people(doc: Doc) -> str:
    """Held-out people on the smartwatch recording: ``entries[*].ratio``,
    ``centralised.test_accuracy``, ``federated.test_accuracy``, each arm's settled device
    scores (``arms.*.device_score_{mean,worst10}_settled``) against its baseline
    (``baseline_of``), and the fleet's ``replied``, ``memory_growth``, ``repeated``
    (``people.json``)."""
    from deploy.bench.people import GOAL

    seeds = [e for e in doc["entries"] if "seed" in e]
    fleet = next(e["fleet"] for e in doc["entries"] if "fleet" in e)
    ratios = [e["ratio"] for e in seeds]
    growth = fleet["memory_growth"]

    def settled(arm: str, key: str) -> str:
        return fmt_spread([e["arms"][arm][f"device_score_{key}_settled"] for e in seeds], "{:.3f}")

    def beats(arm: str) -> str:
        base = doc["baseline_of"][arm]
        won = sum(
            all(
                e["arms"][arm][f"device_score_{k}_settled"]
                > e["arms"][base][f"device_score_{k}_settled"]
                for k in ("mean", "worst10")
            )
            for e in seeds
        )
        return f"{won} of {len(seeds)} seeds"

    personal = [a for a in ("head", "bn") if a in seeds[0]["arms"]]
    paid = any(beats(a).startswith(str(len(seeds))) for a in personal)
    arms = "; ".join(
        f"`{a}` {settled(a, 'mean')} / {settled(a, 'worst10')} against `{doc['baseline_of'][a]}`'s "
        f"{settled(doc['baseline_of'][a], 'mean')} / {settled(doc['baseline_of'][a], 'worst10')}, "
        f"better on both in {beats(a)}"
        for a in personal
    )
    injected = (
        f" Data injection (`inject`): {settled('inject', 'mean')} / "
        f"{settled('inject', 'worst10')}, better on both in {beats('inject')}, held-out "
        f"{fmt_spread([e['arms']['inject']['test_accuracy'] for e in seeds], '{:.3f}')}."
        if "inject" in seeds[0]["arms"]
        else ""
    )
    return bullet(
        f"""**One device per person, held-out people, personal layers** (a real smartwatch
        recording: 10 people, 7 shoulder exercises, natural per-person partitions in recorded
        order, people 8-10 held out; accuracies, virtual clock;
        {fmt_seeds([e["seed"] for e in seeds])}): federated held-out accuracy
        {fmt_spread([e["federated"]["test_accuracy"] for e in seeds], "{:.3f}")} after
        {doc["rounds"]} rounds against a tuned centralised training's
        {fmt_spread([e["centralised"]["test_accuracy"] for e in seeds], "{:.3f}")}:
        {fmt_x(ratios)} (goal >= {GOAL}x: {fmt_verdict(min(ratios) >= GOAL)}). The devices'
        prequential accuracy, mean / worst 10 % over the last 5 rounds: {arms} (goal:
        a personal arm better on both in every seed: {fmt_verdict(paid)}).{injected}
        {fleet["devices"]:,} people (synthetic), twice with one seed:
        {fmt_pct([fleet["replied"]])} of devices replied in every round, memory
        {"n/a" if growth is None else f"{100 * growth:+.1f} %"} from round 2 to the last,
        device scores {"equal" if fleet["repeated"] else "DIFFERENT"} between the runs.
        `fedstream bench people`."""
    )


def privacy(doc: Doc) -> str:
    """Differential privacy on 1,000 virtual devices: each arm's ``final_accuracy`` and
    ``dp_epsilon_spent`` against ``no-dp``, bytes and seconds a round (``privacy.json``)."""
    from deploy.bench.privacy import GOAL_EPSILON, GOAL_POINTS

    seeds = doc["entries"]
    names = list(seeds[0]["arms"])

    def of(arm: str, key: str) -> list[float]:
        return [e["arms"][arm][key] for e in seeds]

    def drop(arm: str) -> list[float]:
        return [
            e["arms"]["no-dp"]["final_accuracy"] - e["arms"][arm]["final_accuracy"] for e in seeds
        ]

    central = [n for n in names if n.startswith("central-") and n != "central-topk"]
    within = [n for n in central if max(of(n, "dp_epsilon_spent")) <= GOAL_EPSILON]
    goal_arm = min(within, key=lambda n: doc["arms"][n]["dp-noise"]) if within else None

    def kilobytes(arm: str) -> str:
        return fmt_spread([b / 1e3 for b in of(arm, "bytes_up_per_round")], "{:.0f}")

    curve = "; ".join(
        f"z {doc['arms'][n]['dp-noise']:g}: epsilon "
        f"{fmt_spread(of(n, 'dp_epsilon_spent'), '{:.1f}')}, "
        f"{fmt_spread(of(n, 'final_accuracy'), '{:.3f}')}"
        for n in central
    )
    goal = (
        f"at epsilon <= {GOAL_EPSILON:g} (`{goal_arm}`) {fmt_spread(drop(goal_arm), '{:+.3f}')} "
        f"below no DP (goal: within {GOAL_POINTS:.2f} in every seed: "
        f"{fmt_verdict(max(drop(goal_arm)) <= GOAL_POINTS)})"
        if goal_arm
        else f"no central arm within epsilon {GOAL_EPSILON:g} (goal: MISSED)"
    )
    extra = []
    if "central-topk" in names:
        extra.append(
            f"top-k under DP {fmt_spread(of('central-topk', 'final_accuracy'), '{:.3f}')} "
            f"with {kilobytes('central-topk')} kB up a round against dense DP's "
            f"{kilobytes(goal_arm or central[0])}"
        )
    if "local" in names:
        extra.append(
            f"local DP (z {doc['arms']['local']['dp-noise']:g} on each device, epsilon "
            f"{fmt_spread(of('local', 'dp_epsilon_spent'), '{:.1f}')}) "
            f"{fmt_spread(of('local', 'final_accuracy'), '{:.3f}')}"
        )
    return bullet(
        f"""**Differential privacy** ({doc["devices"]:,} virtual devices on Flower's simulation
        engine, a tenth drawn each round, {doc["rounds"]} rounds, held-out accuracy of the last
        {doc["settled_rounds"]} rounds; {fmt_seeds([e["seed"] for e in seeds])}): no DP
        {fmt_spread(of("no-dp", "final_accuracy"), "{:.3f}")}; central DP, clip
        {doc["clip"]:g}: {curve}; {goal}. {"; ".join(extra)}. Seconds a round: no DP
        {fmt_spread(of("no-dp", "wall_s_per_round"), "{:.1f}")}, DP arms
        {fmt_spread([v for n in central for v in of(n, "wall_s_per_round")], "{:.1f}")} (wall,
        one run after another on this machine). `fedstream bench privacy`."""
    )


def secagg(doc: Doc) -> str:
    """Secure aggregation's costs beside plain aggregation, and its goals (``secagg.json``:
    ``summary``, and the scale and deployment entries)."""
    from deploy.bench.secagg import DROPOUT_DEVICES, GOAL_POINTS, GOAL_RATIO

    got = doc["summary"]
    entries = doc["entries"]
    ratios = got["ratios_by_devices"]
    sizes = ", ".join(
        f"{e['devices']:,} devices {fmt_spread(ratios[str(e['devices'])], '{:.2f}x')}"
        for e in entries
        if e["part"] == "scale"
    )
    at_100 = next(e for e in entries if e["part"] == "scale" and e["devices"] == DROPOUT_DEVICES)
    secure = at_100["runs"]["secure"][0]
    gaps = got["dropout_gaps"]
    ratio = got["ratio_100"]
    pairs = got["ratios_by_devices"][str(DROPOUT_DEVICES)]
    pairs_met = sum(r <= GOAL_RATIO for r in pairs)
    # Results from before the dropout case that can fail dropped devices after their masked
    # input (their updates stayed in the sum) against plain aggregation with none missing.
    if doc.get("dropout_stage") == "before-masked-input":
        vanishing = "before their masked input (their masks removed with their shares)"
        against = "plain aggregation with the same devices missing"
    else:
        vanishing, against = "after their masked input", "plain aggregation with none missing"
    return bullet(
        f"""**Secure aggregation** (SecAgg+, Flower's simulation engine, every device in every
        round, 20 local steps, seed 0; wall time, each run alone): a secure round over a plain one
        {sizes}; at {DROPOUT_DEVICES} devices {ratio:.2f}x (goal <= {GOAL_RATIO:g}x in every
        alternated pair: {fmt_verdict(pairs_met == len(pairs))}, {pairs_met} of {len(pairs)}
        pairs), {secure["bytes_up_per_device"] / 1e3:.0f} kB up a
        device a round (the masked vector: 4 bytes a value, keys and sealed shares), the
        aggregator unmasking in {secure["unmask_cpu_s"]:.2f} CPU s. On the deployment engine
        with 4 devices: {fmt_spread(got["deployment_ratios"], "{:.2f}x")}. With 10 % of
        {DROPOUT_DEVICES} devices vanishing {vanishing} every round
        ({fmt_seeds(got["dropout_seeds"])}): every round completed
        ({fmt_verdict(got["dropout_completed"])}), final accuracy
        {fmt_spread(gaps, "{:+.3f}")} below {against} (goal: within {GOAL_POINTS:.2f}:
        {fmt_verdict(bool(gaps) and max(abs(g) for g in gaps) <= GOAL_POINTS)}).
        `fedstream bench secagg`."""
    )


#: The Results bullets in the page's order: (function, the JSON files it reads).
BULLETS: list[tuple[Callable[..., str], tuple[str, ...]]] = [
    (hetero, ("hetero",)),
    (streams, ("streams",)),
    (buffers, ("streams",)),
    (label_skew, ("hetero",)),
    (controller_defaults, ("defaults", "hetero")),
    (noniid, ("noniid",)),
    (compression, ("compression",)),
    (forecast, ("forecast",)),
    (reliability, ("reliability",)),
    (asynchronous, ("async",)),
    (deployment, ("deployment",)),
    (footprint, ("deployment",)),
    (agent, ("deployment",)),
    (idle_fleet, ("idle",)),
    (service, ("service",)),
    (drift, ("drift",)),
    (inference, ("inference",)),
    (scale, ("scale",)),
    (bursts, ("bursts",)),
    (people, ("people",)),
    (privacy, ("privacy",)),
    (secagg, ("secagg",)),
]


def render(results: Path) -> str:
    """The Results bullets from the JSON files in ``results``; a bullet made from a stale
    section (:func:`stale`) opens with a mark that says so.

    Parameters
    ----------
    results : Path
        The folder of ``NAME.json`` files (``bench/results``).

    Returns
    -------
    str
        One Markdown bullet per benchmark, in :data:`BULLETS`' order.
    """
    cache: dict[str, Doc] = {}

    def load(name: str) -> Doc:
        if name not in cache:
            cache[name] = json.loads((results / f"{name}.json").read_text())
        return cache[name]

    old = stale(results)
    bullets = []
    for fn, names in BULLETS:
        text = fn(*(load(n) for n in names))
        why = sorted({why.rsplit(" [", 1)[0] for n in names for why in old.get(n, [])})
        if text and why:  # "": a JSON from before the figure existed
            text = bullet(f"*Stale, {'; '.join(why)}: re-run.* {text[2:]}")
        bullets.append(text)
    return "\n".join(b for b in bullets if b)


# -- which results no longer name the code they measured ----------------------------------

ROOT = Path(__file__).resolve().parents[1]


def sections(doc: Doc, where: str = "") -> list[tuple[str, Doc]]:
    """The objects of a results document that hold a section's figures: the document, and
    every object in it that names its own ``commit`` (a section re-run on its own, such as
    ``deployment.json``'s ``controllers-run``)."""
    found = [(where or "(file)", doc)] if "commit" in doc or not where else []
    for key, value in doc.items():
        if isinstance(value, dict) and "commit" in value:
            found += sections(value, f"{where}.{key}" if where else key)
    return found


def staleness(section: Doc, root: Path = ROOT) -> str | None:
    """Why a section no longer names the code it measured, or None while it does: no
    commit or sources recorded, a tree with changes beside the commit, a commit not in
    this history, or sources changed since (in later commits or in the working tree)."""
    commit = section.get("commit")
    if not commit:
        return "names no commit"
    short = str(commit)[:7]
    if section.get("tree-clean") is False:
        return f"measured on {short}: with changes beside it"
    sources = section.get("sources")
    if not sources:
        return f"measured on {short}: names no sources"
    known = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if known.returncode != 0:
        return f"measured on {short}: not a commit of this history"
    # The reason is the page's mark: it names no count or file, so that a later commit
    # does not change the page (`--check` lists the files: changed_sources).
    return (
        f"measured on {short}: its sources changed since"
        if changed_sources(section, root)
        else None
    )


def changed_sources(section: Doc, root: Path = ROOT) -> list[str]:
    """A section's sources changed since its commit (in later commits or the working
    tree); the commit must be one of this history."""
    return subprocess.run(
        ["git", "-C", str(root), "diff", "--name-only", str(section["commit"]), "--",
         *section["sources"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()  # fmt: skip


def stale(results: Path, root: Path = ROOT) -> dict[str, list[str]]:
    """Per results file (its name without ``.json``), why its stale sections are stale;
    files with none are left out."""
    out: dict[str, list[str]] = {}
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        for where, section in sections(doc):
            why = staleness(section, root)
            if why is not None:
                out.setdefault(path.stem, []).append(f"{why} [{where}]")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``--check``: list each stale section (exit 1 if any); without it, the bullets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a result is stale")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if not args.check:
        print(render(args.results))
        return 0
    old = stale(args.results)
    for name, reasons in old.items():
        for why in reasons:
            print(f"{name}.json: {why}")
        # the files only where the reason says so (staleness is not asked again: git twice)
        changed_at = {why.rpartition(" [")[2][:-1] for why in reasons if "changed since" in why}
        doc = json.loads((args.results / f"{name}.json").read_text())
        for where, section in sections(doc):
            if where in changed_at:
                changed = changed_sources(section)
                print(f"  {where}: {len(changed)} changed: {', '.join(changed[:8])} ...")
    count = sum(len(r) for r in old.values())
    print(f"{count} stale section(s)" if count else "no stale section")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
