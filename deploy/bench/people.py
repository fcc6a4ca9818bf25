"""``fedstream bench people``: one device per person on a real multi-subject recording,
held-out people, a tuned centralised training of the same model as the reference, and
personal layers.

The recording is a smartwatch's (:mod:`deploy.bench.watch`: 10 people, 7 shoulder
exercises, accelerometer and gyroscope in their own units, windows of 64 readings). People
1-7 stream, one virtual device each, in recorded order (``fedstream simulate
--partition-by subject``, its defaults: one local epoch a round, each device standardising
its own stream); people 8-10 are held out, scored apart. Time is the streams' virtual clock.
Arms, each changing one setting of the first: ``none`` (the dynamic controller, FedNova),
``head`` and ``bn`` (:mod:`edge_client.task.personal`; ``bn`` on ``model = "cnn-bn"``, so
``none-bn`` is its baseline), ``fixed`` (the equal split), ``fedavg`` and ``inject`` (ScaDLES
data injection: a quarter of the devices share a quarter of what they trained on each round,
every device draws a quarter of each batch from what others shared; the simulation's stand-in
for the broker, :mod:`edge_client.emulation.shared_topic`, delivers it between rounds).

The reference is centralised training of the same model on the same 7 people's windows,
shuffled, with SGD (momentum 0.9), tuned on a grid (learning rate x batch x preprocessing:
none, or each person's channels standardised by that person's statistics, as the devices
do) and epochs, chosen on the last 3 training people held out of its training
(subject-wise validation), then trained again on all 7 and scored once on the 3 held out.

A fleet of 1,000 people (``--quick``: 100; synthetic, :func:`~edge_client.emulation.people.
people_recording`) runs three rounds twice with one seed: every device must reply, the
memory of the run's processes (PSS) stay flat from round 2, and the two runs' device scores
be equal.
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from aggregator.round_log import read_metrics, rounds_only
from deploy.bench.common import (
    PROCESS_SOURCES,
    SEEDS,
    Result,
    footnote,
    markdown_table,
    spread,
    verdict,
)
from deploy.bench.simulation import simulate
from deploy.bench.watch import CHANNELS, CLASSES, WINDOW, watch_people
from deploy.simulate import SimulateConfig, plan_simulation, run_simulation
from edge_client.emulation.people import PEOPLE_KEY, People, people_recording
from edge_client.task.interface import Classification, evaluate, init_model
from edge_client.wire.mapping import kebab

__all__ = ["Config", "centralised", "run"]

TRAINING = 7  # the watch recording's people 1-7 stream; 8-10 are the test
VALIDATION = 3  # the reference's tuning: the last 3 training people held out
ROUNDS, QUICK_ROUNDS = 30, 6
#: The run config every arm shares (the recording's windows and classes).
BASE: dict[str, Any] = {
    kebab("sample_shape"): f"{CHANNELS},{WINDOW}",
    "num-classes": CLASSES,
    "preprocess": "standardize",
}
#: Each arm's change to :data:`BASE`, and the arm it is compared with.
ARMS: dict[str, dict[str, Any]] = {
    "none": {},
    "head": {"personalize": "head"},
    "none-bn": {"model": "cnn-bn"},
    "bn": {"model": "cnn-bn", "personalize": "bn"},
    "fixed": {"controller": "fixed"},
    "fedavg": {"aggregation": "fedavg"},
    "inject": {"inject-alpha": 0.25, "inject-beta": 0.25},
}
SETTLED = 5  # rounds the device scores are averaged over, at the end of a run
BASELINE_OF = {
    "head": "none",
    "bn": "none-bn",
    "fixed": "none",
    "fedavg": "none",
    "inject": "none",
}
#: What each arm's summary keeps.
KEPT = (
    "ok",
    "test_accuracy",
    "test_by_group",
    "device_score_mean",
    "device_score_median",
    "device_score_worst10",
    "device_scores",
    "source_passes",
    "wall_s",
    "virtual_s",
)
LRS, BATCHES, PREPROCESS = (0.01, 0.03, 0.1), (32, 128), ("none", "standardize")
EPOCHS = (5, 10, 20, 30)
MOMENTUM = 0.9
FLEET, QUICK_FLEET, FLEET_ROUNDS = 1000, 100, 3
GOAL = 0.95  # federated held-out accuracy / the tuned centralised one
MEMORY_GROWTH = 0.10  # the fleet's memory, round 2 to last


@dataclass(frozen=True)
class Config:
    """A centralised training's settings."""

    lr: float
    batch: int
    preprocess: str
    epochs: int


def _standardised(people: People, preprocess: str) -> np.ndarray:
    """The windows, each person's channels standardised by that person's statistics (as a
    device does by its stream's) with ``standardize``."""
    if preprocess == "none":
        return people.x
    x = np.empty_like(people.x)
    for person in np.unique(people.subject):
        rows = people.subject == person
        step = Classification(preprocess="standardize").preprocessor()
        assert step is not None
        step.update(people.x[rows])
        x[rows] = step(people.x[rows])
    return x


def _fits(
    x: np.ndarray, y: np.ndarray, lr: float, batch: int, epochs: Sequence[int], seed: int
) -> Iterator[tuple[int, torch.nn.Module]]:
    """Train the run's model (fedstream's CNN) centrally; yield it after each of ``epochs``."""
    task = Classification()
    model = init_model(task, tuple(x.shape[1:]), int(y.max()) + 1, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    order = np.random.default_rng(seed)
    for epoch in range(1, max(epochs) + 1):
        model.train()
        shuffled = order.permutation(len(y))
        for i in range(0, len(y), batch):
            rows = shuffled[i : i + batch]
            opt.zero_grad()
            task.loss(model(xs[rows]), ys[rows]).backward()  # type: ignore[no-untyped-call]
            opt.step()
        if epoch in epochs:
            yield epoch, model


def centralised(
    train: People,
    test: People,
    seed: int,
    grid: Sequence[tuple[float, int, str]],
    epochs: Sequence[int],
) -> dict[str, Any]:
    """The tuned reference: each grid point trained on all but the last :data:`VALIDATION`
    training people and scored on them after each of ``epochs``; the best trained again on
    everyone and scored on ``test``.

    Returns
    -------
    dict
        ``config`` (the chosen :class:`Config`, as a dict), ``validation`` (its score),
        ``test_accuracy``, ``test_by_group`` and ``grid`` (every point's validation score).
    """
    task = Classification()
    people = sorted(set(train.subject.tolist()))
    fit_on, check_on = train.where(people[:-VALIDATION]), train.where(people[-VALIDATION:])
    scored: list[tuple[float, Config]] = []
    for lr, batch, preprocess in grid:
        x, x_check = _standardised(fit_on, preprocess), _standardised(check_on, preprocess)
        for epoch, model in _fits(x, fit_on.y, lr, batch, epochs, seed):
            accuracy = evaluate(task, model, x_check, check_on.y).metric
            scored.append((accuracy, Config(lr, batch, preprocess, epoch)))
    validation, best = max(scored, key=lambda s: s[0])
    x, x_test = _standardised(train, best.preprocess), _standardised(test, best.preprocess)
    _epoch, model = next(_fits(x, train.y, best.lr, best.batch, (best.epochs,), seed))
    scores = evaluate(task, model, x_test, test.y)
    assert scores.values is not None
    by_group = {
        str(g): float(np.mean(scores.values[test.subject == g])) for g in np.unique(test.subject)
    }
    return {
        "config": best.__dict__,
        "validation": validation,
        "test_accuracy": scores.metric,
        "test_by_group": by_group,
        "grid": [{**c.__dict__, "validation": a} for a, c in scored],
    }


def _federated(
    train: Path, test: Path, rounds: int, seed: int, where: Path, run_config: dict[str, Any]
) -> dict[str, Any]:
    """``fedstream simulate --source TRAIN --partition-by subject --test TEST`` with
    ``run_config`` (else its defaults); its summary."""
    config = SimulateConfig(
        rounds=rounds,
        run_config=run_config,
        source=train,
        partition_by=PEOPLE_KEY,
        test=test,
        seed=seed,
        out=where,
        live=False,
    )
    ok = run_simulation(config, Console(quiet=True))
    summary: dict[str, Any] = json.loads(next(where.glob("sim-*/summary.json")).read_text())
    return {**summary, "ok": ok}


def _settled(summary: dict[str, Any]) -> dict[str, float]:
    """The device scores averaged over the last :data:`SETTLED` rounds (``*_settled``): one
    round's worst device, of 7, moves by several points from round to round."""
    per_round = summary["device_score_per_round"]
    return {
        f"device_score_{k}_settled": float(np.mean(per_round[k][-SETTLED:]))
        for k in ("mean", "worst10")
    }


def _fleet(devices: int, seed: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """``devices`` people, one virtual device each, :data:`FLEET_ROUNDS` rounds, twice."""
    where = Path(tempfile.mkdtemp(prefix=f"fedstream-bench-people-{devices}-"))
    try:
        source = people_recording(devices, seed=seed).save(where / "people.npz")
        plan = plan_simulation(
            SimulateConfig(rounds=FLEET_ROUNDS, source=source, partition_by=PEOPLE_KEY, seed=seed)
        )
        extra = {
            k: v
            for k, v in plan.settings.to_run_config().items()
            if k not in ("out-dir", "sim-dir")
        }
        runs, scores = [], []
        for attempt in (1, 2):
            progress(f"  {devices} people, run {attempt} of 2 (one seed)")
            run_dir = where / f"run-{attempt}"
            run_ = simulate(devices, FLEET_ROUNDS, run_dir, extra=extra, progress=progress)
            records = rounds_only(read_metrics(run_dir / "out" / "metrics.jsonl"))
            scores.append(
                [{d: m.eval_metric for d, m in sorted(r.devices.items())} for r in records]
            )
            runs.append(run_)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    memory = [r["memory_bytes"] for r in runs[0]["rounds"]]
    growth = (memory[-1] - memory[1]) / memory[1] if len(memory) > 2 and memory[1] else None
    return {
        "devices": devices,
        "rounds": FLEET_ROUNDS,
        "status": [r["status"] for r in runs],
        "replied": min((e["replied"] for r in runs for e in r["rounds"]), default=0.0),
        "round_wall_s": [e["wall_s"] for e in runs[0]["rounds"]],
        "memory_bytes": memory,
        "memory_growth": growth,
        "memory_peak_bytes": runs[0]["memory_peak_bytes"],
        "repeated": scores[0] == scores[1] and len(scores[0]) == FLEET_ROUNDS,
    }


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """The comparison over :data:`SEEDS` (``quick``: one seed, a small grid, fewer rounds,
    the arms ``none`` and ``head``, and a fleet of 100), and the fleet's run twice."""
    seeds = SEEDS[:1] if quick else SEEDS
    rounds = QUICK_ROUNDS if quick else ROUNDS
    grid = (
        [(0.03, 32, "standardize")] if quick else list(itertools.product(LRS, BATCHES, PREPROCESS))
    )
    epochs = (5, 10) if quick else EPOCHS
    arms = {k: ARMS[k] for k in (("none", "head") if quick else ARMS)}
    people = watch_people()
    subjects = sorted(set(people.subject.tolist()))
    train, test = people.where(subjects[:TRAINING]), people.where(subjects[TRAINING:])
    entries: list[dict[str, Any]] = []
    for seed in seeds:
        progress(f"  seed {seed}: tuned centralised training ({len(grid)} settings)")
        reference = centralised(train, test, seed, grid, epochs)
        results: dict[str, dict[str, Any]] = {}
        where = Path(tempfile.mkdtemp(prefix="fedstream-bench-people-"))
        try:
            files = train.save(where / "train.npz"), test.save(where / "test.npz")
            for name, change in arms.items():
                progress(f"  seed {seed}: {name}, {TRAINING} people, {rounds} rounds")
                run_dir = where / name
                fed = _federated(*files, rounds, seed, run_dir, {**BASE, **change})
                results[name] = {k: fed[k] for k in KEPT} | {"run_config": change} | _settled(fed)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        base = results["none"]
        by_group: dict[str, float] = base["test_by_group"]
        entries.append(
            {
                "seed": seed,
                "centralised": reference,
                "federated": base,
                "arms": results,
                "ratio": base["test_accuracy"] / reference["test_accuracy"],
                "worst_held_out": min(by_group.values()) if by_group else None,
            }
        )
        progress(
            f"    held-out accuracy: federated {base['test_accuracy']:.3f}, centralised "
            f"{reference['test_accuracy']:.3f} ({entries[-1]['ratio']:.2f}x); devices "
            + ", ".join(
                f"{k} {r['device_score_mean_settled']:.3f}/{r['device_score_worst10_settled']:.3f}"
                for k, r in results.items()
            )
        )
    fleet = _fleet(QUICK_FLEET if quick else FLEET, seeds[0], progress)
    return Result(
        "people",
        [*entries, {"fleet": fleet}],
        _table([*entries, {"fleet": fleet}], rounds, quick),
        meta={
            "what": "fedstream simulate on a smartwatch recording (seglearn 1.2.5's watch "
            "set: 10 people, 7 exercises); virtual clock",
            "recording": "seglearn==1.2.5 seglearn/data/watch_dataset.npy (BSD-3-Clause)",
            "window": WINDOW,
            "subjects": len(subjects),
            "training_subjects": TRAINING,
            "rounds": rounds,
            "arms": arms,
            "baseline_of": BASELINE_OF,
            "grid": {
                "learning_rates": LRS,
                "batches": BATCHES,
                "preprocess": PREPROCESS,
                "epochs": EPOCHS,
            },
            "momentum": MOMENTUM,
            "goal": GOAL,
            "quick": quick,
        },
        sources=PROCESS_SOURCES,
    )


def _table(entries: list[dict[str, Any]], rounds: int, quick: bool) -> str:
    """The results table and its lines, from the JSON entries (the seeds', then the fleet's)."""
    seeds = [e for e in entries if "seed" in e]
    fleet = next(e["fleet"] for e in entries if "fleet" in e)
    rows = [
        [
            e["seed"],
            f"{e['centralised']['test_accuracy']:.3f}",
            "lr {lr}, batch {batch}, {preprocess}, {epochs} epochs".format(
                **e["centralised"]["config"]
            ),
            f"{e['federated']['test_accuracy']:.3f}",
            f"{e['ratio']:.2f}",
            f"{e['worst_held_out']:.3f}" if e["worst_held_out"] is not None else "-",
            f"{e['federated']['device_score_mean']:.3f}",
            f"{e['federated']['device_score_worst10']:.3f}",
        ]
        for e in seeds
    ]
    ratios = [e["ratio"] for e in seeds]
    table = markdown_table(
        [
            "seed",
            "centralised, held-out",
            "centralised, tuned to",
            f"federated ({rounds} rounds), held-out",
            "ratio",
            "worst held-out person",
            "devices, mean",
            "devices, worst 10 %",
        ],
        rows,
    )
    growth = fleet["memory_growth"]
    lines = [
        table,
        "",
        f"Ratio over seeds: {spread(ratios)} (goal >= {GOAL}: "
        f"{verdict(min(ratios) >= GOAL)}); median {statistics.median(ratios):.2f}.",
        "",
        arms_table(seeds),
        "",
        f"{fleet['devices']} people, {fleet['rounds']} rounds, twice with one seed: "
        f"{fleet['replied']:.0%} of the devices replied in every round; memory "
        f"{fleet['memory_peak_bytes'] / 2**20:.0f} MiB at the peak, "
        + (f"{growth:+.1%} from round 2 to the last" if growth is not None else "growth n/a")
        + f"; the two runs' device scores {'equal' if fleet['repeated'] else 'DIFFER'}.",
        footnote(
            "The smartwatch recording (seglearn 1.2.5's watch set); fedstream simulate's "
            "defaults but the arms' settings"
            + (" (quick: 1 seed, a small grid)" if quick else "")
            + "; the federation's time is the simulation engine's virtual clock (sim-round-s "
            "a round), the figures are accuracies, not times",
            virtual_clock=False,
        ),
    ]
    return "\n".join(lines)


def arms_table(seeds: list[dict[str, Any]]) -> str:
    """Per arm over the seeds: the devices' prequential scores (mean, worst 10 %; over the
    last :data:`SETTLED` rounds) and the held-out score, and for a changed arm whether it beat
    its baseline on both device scores in each seed."""
    rows = []
    for name in seeds[0]["arms"]:
        of = [e["arms"][name] for e in seeds]
        base = BASELINE_OF.get(name)
        beats = "-"
        if base is not None:
            won = [
                all(
                    e["arms"][name][f"device_score_{k}_settled"]
                    > e["arms"][base][f"device_score_{k}_settled"]
                    for k in ("mean", "worst10")
                )
                for e in seeds
            ]
            beats = f"{sum(won)} of {len(won)} (vs {base})"
        rows.append(
            [
                name,
                ", ".join(f"{k} = {v}" for k, v in of[0]["run_config"].items()) or "-",
                spread([r["device_score_mean_settled"] for r in of], "{:.3f}"),
                spread([r["device_score_worst10_settled"] for r in of], "{:.3f}"),
                spread([r["test_accuracy"] for r in of], "{:.3f}"),
                beats,
            ]
        )
    return markdown_table(
        [
            "arm",
            "changed",
            f"devices, mean (last {SETTLED} rounds)",
            f"devices, worst 10 % (last {SETTLED} rounds)",
            "held-out",
            "beats its baseline on both device scores",
        ],
        rows,
    )
