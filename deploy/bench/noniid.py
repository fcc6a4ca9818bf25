"""Non-IID streams and their mitigation side by side (issue: non-IID + ScaDLES injection).

8 devices, each stream skewed two ways: one label each (pathological; 6 classes, so two
labels are held by two devices) and Dirichlet(0.1) label mixes. Every method trains the same
fleet from the same seeds for the same rounds with the ``fixed`` controller: FedAvg, ScaDLES
data injection (alpha, beta) with the default byte budget and mix, FedProx; the IID reference
is the same fleet without skew.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes

from aggregator.records import RoundRecord
from deploy.bench.common import (
    Panel,
    Result,
    footnote,
    markdown_table,
    rounds_to_target,
    run_fleet,
    save_figure,
    verdict,
)
from deploy.inprocess import VirtualDevice
from edge_client.emulation.sources import pick_classes
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE, DIGITS_CLASSES
from edge_client.task.models import build_model
from edge_client.wire.run_config import RunSettings

__all__ = ["METHODS", "run"]

DEVICES = 8
TARGET_ACCURACY = 0.8
PROX_MU = 0.1
# method -> (opted in to injection, run-config overrides)
METHODS: dict[str, tuple[bool, dict[str, Any]]] = {
    "fedavg": (False, {}),
    "inject-0.25-0.25": (True, {"inject_alpha": 0.25, "inject_beta": 0.25}),
    "inject-0.1-0.1": (True, {"inject_alpha": 0.1, "inject_beta": 0.1}),
    f"fedprox-{PROX_MU:g}": (False, {"proximal_mu": PROX_MU}),
}
PARTITIONS = ("one-label", "dirichlet-0.1")
# Goal for injection (0.25, 0.25): >= 0.9 of IID where FedAvg stays below 0.6 of it.
GOAL_METHOD, GOAL_INJECT, GOAL_FEDAVG = "inject-0.25-0.25", 0.9, 0.6


def fleet(
    partition: str | None,
    inject: bool,
    devices_n: int = DEVICES,
    classes: int = DEFAULT_NUM_CLASSES,
) -> list[VirtualDevice]:
    """The devices; ``partition`` None is the IID reference."""
    devices = []
    for i in range(devices_n):
        skew: dict[str, Any] = {}
        if partition is not None and partition.startswith("one-label"):
            skew["labels"] = pick_classes(1, classes, index=i)
        elif partition == "dirichlet-0.1":
            skew["dirichlet"] = 0.1
        devices.append(VirtualDevice(f"dev-{i}", rate=20_000.0, inject=inject, **skew))
    return devices


def run(quick: bool = False, seed: int = 0) -> Result:
    """IID reference, then every method on every partition."""
    rounds = 15 if quick else 60
    base: dict[str, Any] = {
        "num_rounds": rounds,
        "local_steps": 20,
        "global_batch": 128,
        "b_min": 4,
        "controller": "fixed",
        "eval_samples": 2000,
        "seed": seed,
    }
    model_bytes = 4 * sum(
        p.numel() for p in build_model("cnn", DEFAULT_SHAPE, DEFAULT_NUM_CLASSES).parameters()
    )
    digits_bytes = 4 * sum(p.numel() for p in build_model("cnn", (8, 8), 10).parameters())
    runs: dict[tuple[str, str], list[RoundRecord]] = {}

    def one(
        partition: str | None,
        method: str,
        inject: bool,
        overrides: dict[str, Any],
        digits: bool = False,
    ) -> None:
        devices = fleet(partition, inject, *((DIGITS_CLASSES, DIGITS_CLASSES) if digits else ()))
        data = {"dataset": "digits", "num_classes": 10, "eval_samples": 400} if digits else {}
        settings = RunSettings(**{**base, **data, **overrides})
        key = (partition or ("iid-digits" if digits else "iid"), method)
        runs[key] = run_fleet(f"noniid {key[0]} {method}", devices, settings, seed).records

    one(None, "iid-reference", False, {})
    for partition in PARTITIONS:
        for method, (inject, overrides) in METHODS.items():
            one(partition, method, inject, overrides)
    # The second, real dataset: 10 devices (one per digit), the goal's two methods.
    one(None, "iid-reference", False, {}, digits=True)
    for method in ("fedavg", GOAL_METHOD):
        inject, overrides = METHODS[method]
        one("one-label-digits", method, inject, overrides, digits=True)
    entries = []
    for (partition, method), records in runs.items():
        digits = partition.endswith("digits")
        iid_acc = runs[("iid-digits" if digits else "iid", "iid-reference")][-1].accuracy
        acc = records[-1].accuracy
        inject_bytes = [r.inject_bytes for r in records]
        entries.append(
            {
                "partition": partition,
                "method": method,
                "rounds": len(records),
                "final_accuracy": acc,
                "iid_fraction": acc / iid_acc,
                "rounds_to_target": rounds_to_target(records, TARGET_ACCURACY),
                "inject_bytes_per_round": sum(inject_bytes) / len(records),
                "inject_bytes_max_round": max(inject_bytes),
                "model_update_bytes": digits_bytes if digits else model_bytes,
                "accuracy_curve": [r.accuracy for r in records],
            }
        )
    goal = _goal(entries)
    rows = [
        [
            e["partition"],
            e["method"],
            f"{e['final_accuracy']:.3f}",
            f"{e['iid_fraction']:.2f}",
            e["rounds_to_target"] or f"> {e['rounds']}",
            f"{e['inject_bytes_per_round']:,.0f} (max {e['inject_bytes_max_round']:,})",
        ]
        for e in entries
    ]
    table = markdown_table(
        [
            "partition",
            "method",
            "final accuracy",
            "of IID",
            f"rounds to {TARGET_ACCURACY:g}",
            "injected bytes / round",
        ],
        rows,
    )
    table += footnote(
        f"{DEVICES} devices ('-digits' rows: 10, one per digit, on scikit-learn's 8x8 digits "
        f"streamed as frames, against their own IID reference), {rounds} rounds x 20 local "
        f"steps, B=128, fixed controller, seed {seed}; injection with the default budget "
        "(16,384 B per round for all picked devices) and mix (25 % of each batch from the "
        f"pool); one model update = {model_bytes:,} B of float32 parameters",
        goal["text"],
    )
    meta = {"rounds": rounds, "quick": quick, "seed": seed, "goal": goal}
    return Result("noniid", entries, table, meta, [lambda out: _plot(runs, out)])


def _goal(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per partition: injection (0.25, 0.25) >= 0.9 of IID and FedAvg < 0.6 of it, with
    injected bytes per round below one model update."""
    by = {(e["partition"], e["method"]): e for e in entries}
    verdicts = {}
    for partition in PARTITIONS:
        inj, avg = by[(partition, GOAL_METHOD)], by[(partition, "fedavg")]
        verdicts[partition] = {
            "inject_iid_fraction": inj["iid_fraction"],
            "fedavg_iid_fraction": avg["iid_fraction"],
            "inject_met": inj["iid_fraction"] >= GOAL_INJECT,
            "fedavg_below": avg["iid_fraction"] < GOAL_FEDAVG,
            "bytes_met": inj["inject_bytes_max_round"] < inj["model_update_bytes"],
        }
    text = "; ".join(
        f"{p}: injection {v['inject_iid_fraction']:.2f} of IID "
        f"({verdict(v['inject_met'])} >= {GOAL_INJECT}), FedAvg "
        f"{v['fedavg_iid_fraction']:.2f} ({'below' if v['fedavg_below'] else 'NOT below'} "
        f"{GOAL_FEDAVG}), bytes {'under' if v['bytes_met'] else 'OVER'} one update"
        for p, v in verdicts.items()
    )
    return {"partitions": verdicts, "text": text}


def _plot(runs: dict[tuple[str, str], list[RoundRecord]], out: Path) -> Path:
    iid = runs[("iid", "iid-reference")]

    def draw(axes: list[Axes]) -> None:
        for ax, partition in zip(axes, PARTITIONS, strict=True):
            ax.plot([r.round for r in iid], [r.accuracy for r in iid], "k--", label="IID")
            for (p, method), records in runs.items():
                if p == partition:
                    ax.plot([r.round for r in records], [r.accuracy for r in records], label=method)

    panels = [Panel("round", "accuracy", title=partition) for partition in PARTITIONS]
    return save_figure(out / "noniid.png", panels, draw)
