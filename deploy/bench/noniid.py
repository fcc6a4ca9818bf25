"""Non-IID streams and their mitigation side by side (issue: non-IID + ScaDLES injection).

8 devices, each stream skewed two ways: one label each (pathological; 6 classes, so two
labels are held by two devices) and Dirichlet(0.1) label mixes; and, on a real dataset,
10 devices streaming scikit-learn's 8x8 digits, one digit each. Every method trains the same
fleet from the same seeds for the same rounds with the ``fixed`` controller: FedAvg, ScaDLES
data injection (alpha, beta) with the default byte budget and mix, FedProx; the IID
reference is the same fleet without skew. The full run repeats everything over
:data:`~deploy.bench.common.SEEDS` (``quick``: the first seed, fewer rounds, no FedProx).

Injection is counted *as delivered*: a frame a picked device queues goes up to the broker
once and down to every other opted-in device (the broker fans it out), so a round delivers
``queued x (opted-in - 1)`` bytes, compared here with the round's model traffic (every
device's update up and the model down to every device). A sweep (full run only, one-label,
first seed) halves and doubles the byte budget and moves the mix, to show which parameter
binds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes

from aggregator.round_log import RoundRecord
from deploy.bench import common
from deploy.bench.common import run_fleet
from deploy.inprocess import VirtualDevice
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.constants import INJECT_POOL_CAPACITY
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE, DIGITS_CLASSES
from edge_client.task.models import build_model
from edge_client.wire.run_config import RunSettings, default

__all__ = [
    "METHODS",
    "SWEEP",
    "RoundTraffic",
    "Shares",
    "budget_cuts",
    "fleet",
    "main_table",
    "pool_use",
    "round_traffic",
    "run",
    "split_entries",
    "sweep_table",
]

DEVICES = 8
TARGET_ACCURACY = 0.8
PROX_MU = 0.1
INJECT: dict[str, Any] = {"inject_alpha": 0.25, "inject_beta": 0.25}
# method -> (opted in to injection, run-config overrides)
METHODS: dict[str, tuple[bool, dict[str, Any]]] = {
    "fedavg": (False, {}),
    "inject-0.25-0.25": (True, INJECT),
    f"fedprox-{PROX_MU:g}": (False, {"proximal_mu": PROX_MU}),
}
PARTITIONS = ("one-label", "dirichlet-0.1")
DIGITS_PARTITION = "one-label-digits"
DIGITS_METHODS = ("fedavg", "inject-0.25-0.25")
BUDGET: int = default("inject_budget")
MIX: float = default("inject_mix")
# Which parameter binds: injection (0.25, 0.25) on the one-label fleet with the byte budget
# halved and doubled, and the mix lowered and raised (full run, first seed).
SWEEP_PARTITION = "one-label"
SWEEP: dict[str, dict[str, Any]] = {
    f"budget-{BUDGET // 2}": {**INJECT, "inject_budget": BUDGET // 2},
    f"budget-{BUDGET * 2}": {**INJECT, "inject_budget": BUDGET * 2},
    "mix-0.1": {**INJECT, "inject_mix": 0.1},
    "mix-0.5": {**INJECT, "inject_mix": 0.5},
}
# Goal for injection (0.25, 0.25): >= 0.9 of IID where FedAvg stays below 0.6 of it, with
# the injected bytes of a round, as delivered, below one model update.
GOAL_METHOD, GOAL_INJECT, GOAL_FEDAVG = "inject-0.25-0.25", 0.9, 0.6
GOAL_PARTITIONS = (*PARTITIONS, DIGITS_PARTITION)
POOL_KEYS = ("pool_end", "pool_fraction", "draws_per_sample")  # see pool_use
#: What an entry gives per seed (as ``<figure>_per_seed``), in the entry's order.
PER_SEED = (
    "final_accuracy",
    "iid_fraction",
    "rounds_to_target",
    "queued_bytes_per_round",
    "delivered_bytes_per_round",
    "delivered_bytes_max_round",
    "model_bytes_per_round",
    "delivered_of_model_traffic",
    "shares",
    "shares_cut",
    *POOL_KEYS,
)


@dataclass(frozen=True)
class RoundTraffic:
    """What a round moved: injection as queued and as delivered, and the model's traffic.

    Attributes
    ----------
    queued_bytes : int
        Injection frames the picked devices queued (each goes up to the broker once).
    frames : int
        How many frames they queued.
    delivered_frames, delivered_bytes : int
        The frames and bytes the broker delivered: each frame to every other opted-in
        device, ``queued x (opted-in - 1)``.
    model_bytes : int
        Every device's update frame up and the model down to every device messaged.
    """

    queued_bytes: int
    frames: int
    delivered_frames: int
    delivered_bytes: int
    model_bytes: int


def round_traffic(record: RoundRecord) -> RoundTraffic:
    """The injection and model traffic of one round, from its record.

    Parameters
    ----------
    record : RoundRecord
        The round; its devices' ``inject_opt_in`` say who receives injection frames.

    Returns
    -------
    RoundTraffic
        Injection counted as queued and as delivered, and the model traffic.
    """
    fanout = max(0, sum(m.inject_opt_in >= 1 for m in record.devices.values()) - 1)
    frames = sum(1 for m in record.devices.values() if m.inject_bytes > 0)
    return RoundTraffic(
        queued_bytes=record.inject_bytes,
        frames=frames,
        delivered_frames=frames * fanout,
        delivered_bytes=record.inject_bytes * fanout,
        model_bytes=record.bytes_up + record.broadcast_bytes * len(record.planned),
    )


@dataclass(frozen=True)
class Shares:
    """What the picked devices shared over a run, against what beta alone would have shared.

    Attributes
    ----------
    shares : int
        Shares made (a picked device that trained).
    cut : int
        Shares the byte budget cut: fewer samples than ``beta`` of the device's own samples
        trained that round.
    samples, wanted : int
        Samples shared, and what ``beta`` alone would have shared, over all the shares.
    """

    shares: int = 0
    cut: int = 0
    samples: int = 0
    wanted: int = 0

    def __add__(self, other: Shares) -> Shares:
        return Shares(
            self.shares + other.shares,
            self.cut + other.cut,
            self.samples + other.samples,
            self.wanted + other.wanted,
        )


def budget_cuts(records: Sequence[RoundRecord], beta: float) -> Shares:
    """The shares the picked devices made over a run, and how many the byte budget cut.

    Parameters
    ----------
    records : sequence of RoundRecord
        The run.
    beta : float
        The run's ``inject-beta``.

    Returns
    -------
    Shares
        Counted over every picked device that trained (one that trained nothing shares
        nothing, whatever the budget).
    """
    total = Shares()
    for r in records:
        for device in r.inject_picked:
            m = r.devices.get(device)
            if m is None or m.num_examples == 0:
                continue
            wanted = int(beta * (m.num_examples - m.inject_used))
            total += Shares(1, int(m.inject_samples < wanted), m.inject_samples, wanted)
    return total


def pool_use(records: Sequence[RoundRecord]) -> dict[str, float]:
    """How the opted-in devices' pools were fed and drawn from over a run.

    Pools are drawn from, never consumed (``BufferStore.sample``): each batch takes its
    mix from the pool at random, and the samples stay for later rounds.

    Parameters
    ----------
    records : sequence of RoundRecord
        The run.

    Returns
    -------
    dict
        ``pool_end`` (mean samples in an opted-in device's pool at the end, capped at
        :data:`~edge_client.runtime.constants.INJECT_POOL_CAPACITY`), ``pool_fraction``
        (share of the samples trained that came from the pool) and ``draws_per_sample``
        (pool draws per sample delivered into a pool: above 1, samples are reused).
        Empty when no device opted in.
    """
    opted = {d for r in records for d, m in r.devices.items() if m.inject_opt_in >= 1}
    if not opted:
        return {}
    received = dict.fromkeys(opted, 0)
    for r in records:
        for device in opted:
            received[device] += sum(
                r.devices[p].inject_samples
                for p in r.inject_picked
                if p != device and p in r.devices
            )
    used = sum(m.inject_used for r in records for m in r.devices.values())
    trained = sum(m.num_examples for r in records for m in r.devices.values())
    delivered = sum(received.values())
    return {
        "pool_end": statistics.mean(min(n, INJECT_POOL_CAPACITY) for n in received.values()),
        "pool_fraction": used / trained if trained else 0.0,
        "draws_per_sample": used / delivered if delivered else 0.0,
    }


def fleet(
    partition: str | None,
    inject: bool,
    devices_n: int = DEVICES,
    classes: int = DEFAULT_NUM_CLASSES,
) -> list[VirtualDevice]:
    """The devices.

    Parameters
    ----------
    partition : str or None
        ``one-label...`` (one class each, round-robin), ``dirichlet-0.1``, or None (the IID
        reference).
    inject : bool
        Opted in to data injection.
    devices_n, classes : int
        Fleet size and number of classes.

    Returns
    -------
    list of VirtualDevice
        ``dev-0`` ... with streams far ahead of training (rate 20,000 samples/s).
    """
    devices = []
    for i in range(devices_n):
        skew: dict[str, Any] = {}
        if partition is not None and partition.startswith("one-label"):
            skew["labels"] = pick_classes(1, classes, index=i)
        elif partition == "dirichlet-0.1":
            skew["dirichlet"] = 0.1
        devices.append(VirtualDevice(f"dev-{i}", rate=20_000.0, inject=inject, **skew))
    return devices


Runs = dict[tuple[str, str, int], list[RoundRecord]]  # (partition, method, seed) -> rounds


def run(quick: bool = False) -> common.Result:
    """The IID references, then every method on every partition, for every seed; then (full
    run only) the injection sweep on the first seed.

    Parameters
    ----------
    quick : bool
        One seed, 10 rounds, no FedProx and no sweep (a smoke test: about 40 s of CPU
        here); otherwise :data:`~deploy.bench.common.SEEDS` and 50 rounds (about 14 minutes
        of CPU here; 50 rounds give one-label injection time to level off).

    Returns
    -------
    Result
        One entry per (partition, method), its figures per seed and their means.
    """
    seeds = common.SEEDS[:1] if quick else common.SEEDS
    rounds = 10 if quick else 50
    update_bytes = _update_bytes()
    runs, settings_of = _run_all(seeds, rounds, quick)
    entries = [
        _entry(
            runs,
            name,
            method,
            settings_of[(name, method)],
            update_bytes[name.endswith("digits")],
        )
        for name, method in settings_of
    ]
    goal = _goal(entries)
    main, sweep = split_entries(entries)
    table = main_table(main, rounds)
    if not quick:
        table += f"\n\nSweep: injection (0.25, 0.25) on {SWEEP_PARTITION}, seed {seeds[0]}.\n\n"
        table += sweep_table(sweep, rounds)
    inj = next(e for e in main if e["partition"] == "one-label" and e["method"] == GOAL_METHOD)
    table += _footnote(rounds, seeds, update_bytes, inj, goal["text"])
    meta = {
        "rounds": rounds,
        "quick": quick,
        "seeds": list(seeds),
        "chance": {"default": 1 / DEFAULT_NUM_CLASSES, "digits": 1 / DIGITS_CLASSES},
        "goal": goal,
    }
    return common.Result("noniid", entries, table, meta, [lambda out: _plot(runs, seeds, out)])


def _run_all(
    seeds: Sequence[int], rounds: int, quick: bool
) -> tuple[Runs, dict[tuple[str, str], RunSettings]]:
    """For each seed the IID references and every method on every partition, then (not
    ``quick``) the sweep on the first seed; the rounds of each, and each (partition,
    method)'s settings."""
    methods = {m: v for m, v in METHODS.items() if not (quick and m.startswith("fedprox"))}
    base: dict[str, Any] = {
        "num_rounds": rounds,
        "local_steps": 20,
        "global_batch": 128,
        "b_min": 4,
        "controller": "fixed",
        "aggregation": "fedavg",  # the baseline the methods are named against
        "eval_data": "synthetic",
        "eval_samples": 2000,
    }
    digits_data = {
        "dataset": "digits",
        "sample_shape": "8,8",
        "num_classes": DIGITS_CLASSES,
        "eval_data": "digits",
        "eval_samples": 400,
    }
    runs: Runs = {}
    settings_of: dict[tuple[str, str], RunSettings] = {}

    def one(
        partition: str | None,
        method: str,
        inject: bool,
        overrides: dict[str, Any],
        seed: int,
        digits: bool = False,
    ) -> None:
        shape = (DIGITS_CLASSES, DIGITS_CLASSES) if digits else ()
        devices = fleet(partition, inject, *shape)
        data = digits_data if digits else {}
        settings = RunSettings(**{**base, **data, **overrides, "seed": seed})
        name = partition or ("iid-digits" if digits else "iid")
        settings_of[(name, method)] = settings
        label = f"noniid {name} {method} seed {seed}"
        runs[(name, method, seed)] = run_fleet(label, devices, settings, seed).records

    for seed in seeds:
        one(None, "iid-reference", False, {}, seed)
        for partition in PARTITIONS:
            for method, (inject, overrides) in methods.items():
                one(partition, method, inject, overrides, seed)
        one(None, "iid-reference", False, {}, seed, digits=True)
        for method in DIGITS_METHODS:
            inject, overrides = METHODS[method]
            one(DIGITS_PARTITION, method, inject, overrides, seed, digits=True)
    if not quick:
        for method, overrides in SWEEP.items():
            one(SWEEP_PARTITION, method, True, overrides, seeds[0])
    return runs, settings_of


def _update_bytes() -> dict[bool, int]:
    """One model update's float32 bytes, on the default task (False) and on digits (True)."""
    return {
        False: 4
        * sum(
            p.numel() for p in build_model("cnn", DEFAULT_SHAPE, DEFAULT_NUM_CLASSES).parameters()
        ),
        True: 4 * sum(p.numel() for p in build_model("cnn", (8, 8), DIGITS_CLASSES).parameters()),
    }


def split_entries(
    entries: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The entries of the main table, and those of the injection sweep (the default
    injection on the sweep's partition first, then the sweep's runs)."""
    main = [e for e in entries if e["method"] not in SWEEP]
    sweep = [e for e in entries if e["method"] == GOAL_METHOD and e["partition"] == SWEEP_PARTITION]
    sweep += [e for e in entries if e["method"] in SWEEP]
    return main, sweep


def main_table(main: Sequence[dict[str, Any]], rounds: int) -> str:
    """The results table: every (partition, method) but the sweep's.

    Parameters
    ----------
    main : sequence of dict
        Their entries (as in ``noniid.json``).
    rounds : int
        Rounds of each run (a target never reached reads ``> rounds``).

    Returns
    -------
    str
        Final accuracy, its fraction of IID, rounds to the target and the injection's traffic,
        as a markdown table.
    """
    rows = [
        [
            e["partition"],
            e["method"],
            common.spread(e["final_accuracy_per_seed"], "{:.3f}"),
            common.spread(e["iid_fraction_per_seed"]),
            _rounds_text(e["rounds_to_target_per_seed"], rounds),
            *(
                [
                    common.spread(e["delivered_bytes_per_round_per_seed"], "{:,.0f}"),
                    common.spread(e["delivered_of_model_traffic_per_seed"]),
                ]
                if e["shares"]
                else ["-", "-"]
            ),
        ]
        for e in main
    ]
    headers = [
        "partition",
        "method",
        "final accuracy",
        "of IID",
        f"rounds to {TARGET_ACCURACY:g}",
        "injection delivered / round (B)",
        "of the round's model traffic",
    ]
    return common.markdown_table(headers, rows)


def sweep_table(sweep: Sequence[dict[str, Any]], rounds: int) -> str:
    """The sweep's table: what the budget and the mix change (first seed).

    Parameters
    ----------
    sweep : sequence of dict
        The entries of the sweep's runs and of the default injection on its partition.
    rounds : int
        Rounds of each run.

    Returns
    -------
    str
        The markdown table.
    """
    return common.markdown_table(
        [
            "run",
            "budget (B)",
            "mix",
            "queued / round (B)",
            "delivered / round (B)",
            "shares cut by the budget",
            "pool share of samples trained",
            "final accuracy",
            "of IID",
            f"rounds to {TARGET_ACCURACY:g}",
        ],
        [
            [
                "default" if e["method"] == GOAL_METHOD else e["method"],
                f"{e['inject_budget']:,}",
                f"{e['inject_mix']:g}",
                f"{e['queued_bytes_per_round_per_seed'][0]:,.0f}",
                f"{e['delivered_bytes_per_round_per_seed'][0]:,.0f}",
                f"{e['shares_cut_per_seed'][0]} of {e['shares_per_seed'][0]}",
                f"{e['pool_fraction_per_seed'][0]:.2f}",
                f"{e['final_accuracy_per_seed'][0]:.3f}",
                f"{e['iid_fraction_per_seed'][0]:.2f}",
                e["rounds_to_target_per_seed"][0] or f"> {rounds}",
            ]
            for e in sweep
        ],
    )


def _footnote(
    rounds: int,
    seeds: Sequence[int],
    update_bytes: dict[bool, int],
    inj: dict[str, Any],
    goals: str,
) -> str:
    """The setup under the table, with the injection's figures (``inj``: one-label's
    injection entry) and the goals."""
    return common.footnote(
        f"{DEVICES} devices ('-digits' rows: 10, one per digit, on scikit-learn's 8x8 digits "
        f"streamed as frames, against their own IID reference), {rounds} rounds x 20 local "
        f"steps, B=128, fixed controller; seeds {', '.join(map(str, seeds))}, each figure the "
        "mean (min-max) over them, 'rounds to' needing the target held for two evaluations; "
        f"chance is {1 / DEFAULT_NUM_CLASSES:.2f} ({1 / DIGITS_CLASSES:.2f} on digits). "
        f"Injection with the default budget ({BUDGET:,} B per round for all picked devices "
        f"together) and mix ({MIX:g} of each batch from the pool), counted as delivered: each "
        "queued frame reaches every other opted-in device (queued x (opted-in - 1)); the "
        "round's model traffic is every update up plus the model down to every device; one "
        f"model update = {update_bytes[False]:,} B of float32 parameters "
        f"({update_bytes[True]:,} B on digits). The budget binds, not beta: on one-label "
        f"it cut {inj['shares_cut']} of {inj['shares']} shares (beta would share "
        f"{inj['beta_wanted']:.0f} samples, the budget fits {inj['samples_per_share']:.1f}). "
        "The pool is drawn from, not consumed: at the end an opted-in device's pool holds "
        f"{inj['pool_end']:,.0f} samples (cap {INJECT_POOL_CAPACITY:,}), which gave "
        f"{inj['pool_fraction']:.2f} of the samples trained, each pooled sample drawn "
        f"{inj['draws_per_sample']:.1f} times on average",
        goals,
    )


def _rounds_text(values: Sequence[int | None], rounds: int) -> str:
    """Rounds to the target over the seeds: their spread, or ``> rounds`` when no seed
    reached it."""
    if all(v is None for v in values):
        return f"> {rounds}"
    return common.spread([None if v is None else float(v) for v in values], "{:.0f}")


def _entry(
    runs: dict[tuple[str, str, int], list[RoundRecord]],
    partition: str,
    method: str,
    settings: RunSettings,
    update_bytes: int,
) -> dict[str, Any]:
    """One (partition, method): its figures per seed that ran it, and their means."""
    seeds = sorted(s for p, m, s in runs if (p, m) == (partition, method))
    reference = "iid-digits" if partition.endswith("digits") else "iid"
    per_seed: dict[str, list[Any]] = {k: [] for k in PER_SEED}
    shares = Shares()
    for seed in seeds:
        records = runs[(partition, method, seed)]
        iid = runs[(reference, "iid-reference", seed)][-1].test_accuracy
        traffic = [round_traffic(r) for r in records]
        delivered = statistics.mean(t.delivered_bytes for t in traffic)
        model = statistics.mean(t.model_bytes for t in traffic)
        per_seed["final_accuracy"].append(records[-1].test_accuracy)
        per_seed["iid_fraction"].append(records[-1].test_accuracy / iid)
        per_seed["rounds_to_target"].append(common.rounds_to_target(records, TARGET_ACCURACY))
        per_seed["queued_bytes_per_round"].append(statistics.mean(t.queued_bytes for t in traffic))
        per_seed["delivered_bytes_per_round"].append(delivered)
        per_seed["delivered_bytes_max_round"].append(max(t.delivered_bytes for t in traffic))
        per_seed["model_bytes_per_round"].append(model)
        per_seed["delivered_of_model_traffic"].append(delivered / model)
        cuts = budget_cuts(records, settings.inject_beta)
        shares += cuts
        per_seed["shares"].append(cuts.shares)
        per_seed["shares_cut"].append(cuts.cut)
        use = pool_use(records)
        for k in POOL_KEYS:
            per_seed[k].append(use.get(k, 0.0))
    return {
        "partition": partition,
        "method": method,
        "seeds": seeds,
        "rounds": len(runs[(partition, method, seeds[0])]),
        "inject_alpha": settings.inject_alpha,
        "inject_beta": settings.inject_beta,
        "inject_budget": settings.inject_budget,
        "inject_mix": settings.inject_mix,
        "proximal_mu": settings.proximal_mu,
        **{f"{k}_per_seed": v for k, v in per_seed.items()},
        "final_accuracy": statistics.mean(per_seed["final_accuracy"]),
        "iid_fraction": statistics.mean(per_seed["iid_fraction"]),
        "rounds_to_target": common.mean_or_none(per_seed["rounds_to_target"]),
        "delivered_bytes_per_round": statistics.mean(per_seed["delivered_bytes_per_round"]),
        "delivered_bytes_max_round": max(per_seed["delivered_bytes_max_round"]),
        "delivered_of_model_traffic": statistics.mean(per_seed["delivered_of_model_traffic"]),
        "model_update_bytes": update_bytes,
        "shares": shares.shares,
        "shares_cut": shares.cut,
        "samples_per_share": shares.samples / shares.shares if shares.shares else 0.0,
        "beta_wanted": shares.wanted / shares.shares if shares.shares else 0.0,
        **{k: statistics.mean(per_seed[k]) for k in POOL_KEYS},
        "accuracy_curve_per_seed": [
            [r.test_accuracy for r in runs[(partition, method, s)]] for s in seeds
        ],
    }


def _goal(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per partition: injection (0.25, 0.25) >= 0.9 of IID in every seed where FedAvg
    stays below 0.6 of it (mean over the seeds: the goal's premise, not a goal), and
    injection delivered in every round below one model update;
    the IID reference must itself reach the accuracy target (else 'of IID' says nothing)."""
    by = {(e["partition"], e["method"]): e for e in entries}
    verdicts = {}
    present = {e["partition"] for e in entries}
    for partition in (p for p in GOAL_PARTITIONS if p in present):
        inj, avg = by[(partition, GOAL_METHOD)], by[(partition, "fedavg")]
        ref = by[("iid-digits" if partition.endswith("digits") else "iid", "iid-reference")]
        verdicts[partition] = {
            "inject_iid_fraction": inj["iid_fraction"],
            "inject_seeds_met": sum(f >= GOAL_INJECT for f in inj["iid_fraction_per_seed"]),
            "seeds": len(inj["seeds"]),
            "fedavg_iid_fraction": avg["iid_fraction"],
            "inject_met": all(f >= GOAL_INJECT for f in inj["iid_fraction_per_seed"]),
            "fedavg_below": avg["iid_fraction"] < GOAL_FEDAVG,
            "reference_trained": all(r is not None for r in ref["rounds_to_target_per_seed"]),
            "delivered_bytes_per_round": inj["delivered_bytes_per_round"],
            "delivered_updates_per_round": inj["delivered_bytes_per_round"]
            / inj["model_update_bytes"],
            "delivered_of_model_traffic": inj["delivered_of_model_traffic"],
            "bytes_met": inj["delivered_bytes_max_round"] < inj["model_update_bytes"],
        }
    text = "; ".join(
        f"{p}: injection {v['inject_iid_fraction']:.2f} of IID "
        f"({common.verdict(v['inject_met'])} >= {GOAL_INJECT}; {v['inject_seeds_met']} of "
        f"{v['seeds']} seeds), FedAvg {v['fedavg_iid_fraction']:.2f} "
        f"({'below' if v['fedavg_below'] else 'NOT below'} {GOAL_FEDAVG}: the goal's premise), "
        f"IID reference {'reaches' if v['reference_trained'] else 'does NOT reach'} "
        f"{TARGET_ACCURACY:g}; injection delivered {v['delivered_bytes_per_round']:,.0f} B per "
        f"round = {v['delivered_updates_per_round']:.1f} model updates "
        f"({common.verdict(v['bytes_met'])} < 1 in every round), "
        f"{v['delivered_of_model_traffic']:.2f} of the round's model traffic"
        for p, v in verdicts.items()
    )
    return {"partitions": verdicts, "text": text}


def _plot(
    runs: dict[tuple[str, str, int], list[RoundRecord]], seeds: Sequence[int], out: Path
) -> Path:
    """Accuracy per round, mean over the seeds, per partition (chance and the goal marked);
    the sweep on the first seed, when it ran."""
    panels_of = [*GOAL_PARTITIONS]
    sweep = any(m in SWEEP for _, m, _ in runs)
    if sweep:
        panels_of.append("sweep")

    def mean_curve(partition: str, method: str) -> tuple[list[int], list[float]]:
        curves = [runs[(partition, method, s)] for s in seeds]
        return [r.round for r in curves[0]], [
            statistics.mean(c[i].test_accuracy for c in curves) for i in range(len(curves[0]))
        ]

    def draw(axes: list[Axes]) -> None:
        for ax, partition in zip(axes, panels_of, strict=True):
            if partition == "sweep":
                for (p, method, s), records in runs.items():
                    if p == SWEEP_PARTITION and s == seeds[0] and method in (*SWEEP, GOAL_METHOD):
                        label = "default" if method == GOAL_METHOD else method
                        ax.plot(
                            [r.round for r in records],
                            [r.test_accuracy for r in records],
                            label=label,
                        )
                continue
            digits = partition.endswith("digits")
            x, iid = mean_curve("iid-digits" if digits else "iid", "iid-reference")
            ax.plot(x, iid, "k--", label="IID")
            ax.axhline(GOAL_INJECT * iid[-1], color="grey", lw=0.8, ls="-.", label="0.9 of IID")
            chance = 1 / (DIGITS_CLASSES if digits else DEFAULT_NUM_CLASSES)
            ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
            for method in dict.fromkeys(m for p, m, _ in runs if p == partition and m not in SWEEP):
                ax.plot(*mean_curve(partition, method), label=method)

    titles = {p: f"{p} (mean of {len(seeds)} seeds)" for p in GOAL_PARTITIONS}
    titles["sweep"] = f"{SWEEP_PARTITION} injection sweep (seed {seeds[0]})"
    panels = [
        common.Panel("round", "accuracy", title=titles[p], ylim=(0.0, 1.0)) for p in panels_of
    ]
    return common.save_figure(out / "noniid.png", panels, draw, width=5.0)
