"""``fedstream simulate``: a federation on Flower's simulation engine, on this machine.

It starts a SuperLink in simulation mode with one virtual device per node, submits
fedstream's app, shows the rounds as they come and writes what the demo writes:
``metrics.jsonl``, ``summary.json`` and ``report.png`` in ``runs/sim-<time>/``.

With ``--source`` the virtual devices stream a recording, split across them
(:mod:`edge_client.emulation.partitions`): ``--partition-by user`` makes one device per user,
each streaming that user's samples in recorded order; ``--partition`` takes Flower Datasets'
other partitioners. Unless the run config says otherwise, a round is one local epoch
(FedAvg's E = 1): ``local-steps`` K takes the median device once over its part with batches of
``global-batch`` / devices (8 each), and every device streams what a round trains on, b x K, a round
(``sim-rates``, from the start: ``sim-initial``); a part that ends starts over, and
``source_passes`` in the summary says how often. Each device standardises its stream by its
own running statistics (``preprocess``: a recording is in its sensors' units). Time is the
streams' virtual clock (``sim-round-s`` a round), so a seeded run repeats. Without a
recording the devices stream the synthetic task, as ``sim-population`` (or ``sim-rates`` and
``sim-slowdowns``) says.

``--test`` scores each round's model on a held-out file on the aggregator; when it holds the
partition key too, each held-out group apart (``test_by_group``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from deploy.constants import (
    APP_DIR,
    DEMO_STATUS_CHECK_S,
    DEMO_STATUS_POLL_S,
    SIMULATE_BATCH_PER_DEVICE,
    SIMULATE_DEVICES,
    SIMULATE_RECORDING_BATCH_PER_DEVICE,
    SIMULATE_SHOWN_DEVICES,
)
from deploy.demo_view import progress_table, source_passes
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup
from deploy.report import summarize, write_report
from edge_client.emulation.partitions import split_recording
from edge_client.task.recordings import load_groups, load_recording
from edge_client.wire.mapping import kebab
from edge_client.wire.partitioning import scheme_of
from edge_client.wire.run_config import RunSettings

__all__ = ["SimulateConfig", "SimulationPlan", "plan_simulation", "run_simulation"]


@dataclass
class SimulateConfig:
    """What ``fedstream simulate`` was asked (see its ``--help``)."""

    devices: int | None = None
    rounds: int | None = None
    run_config: dict[str, Any] = field(default_factory=dict)
    out: Path = Path("runs")
    source: Path | None = None
    partition_by: str | None = None
    partition: str | None = None
    test: Path | None = None
    seed: int = 0
    live: bool = True

    def __post_init__(self) -> None:
        if self.devices is not None and self.devices < 1:
            raise ValueError(f"--devices must be >= 1, got {self.devices}")
        if (self.partition_by or self.partition) and self.source is None:
            raise ValueError("--partition-by and --partition split a recording: give --source")


@dataclass(frozen=True)
class SimulationPlan:
    """What will run: the settings, how many virtual devices, and each device's part.

    Attributes
    ----------
    settings : RunSettings
        The run config submitted (``out-dir`` and ``sim-dir`` set when it runs).
    devices : int
        Virtual devices (simulation nodes).
    shards : dict of str to int
        With a recording: each device's id and the samples of its part.
    left_out : dict of str to int
        Groups too small to make a device, and their sizes.
    groups_in_test : bool
        Whether ``--test`` holds the partition key (scored per group).
    """

    settings: RunSettings
    devices: int
    shards: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    groups_in_test: bool = False


def plan_simulation(config: SimulateConfig) -> SimulationPlan:
    """The run a :class:`SimulateConfig` asks for, checked before anything starts.

    Raises
    ------
    ValueError
        If a setting is bad, the recording cannot be read or split (the message names the
        keys a file has when the partition key is not one of them), ``--devices`` asks for
        more devices than the recording has groups, or the test file does not fit it.
    ImportError
        Without Flower Datasets (``pip install 'fedstream[simulation]'``).
    """
    given = dict(config.run_config)
    if config.rounds is not None:
        given["num-rounds"] = config.rounds
    given["seed"] = config.seed
    if config.source is None:
        devices = config.devices or SIMULATE_DEVICES
        given.setdefault("global-batch", SIMULATE_BATCH_PER_DEVICE * devices)
        if config.test is not None:
            given["eval-data"] = str(config.test.resolve())
        return SimulationPlan(RunSettings.from_run_config(given), devices)
    return _recording_plan(config, given)


def _recording_plan(config: SimulateConfig, given: dict[str, Any]) -> SimulationPlan:
    """:func:`plan_simulation` for a run on a recording."""
    assert config.source is not None
    source = str(config.source.resolve())
    key = config.partition_by or ""
    scheme = scheme_of(config.partition or "", key)
    wanted = config.devices or (None if scheme.kind == "natural" else SIMULATE_DEVICES)
    split = split_recording(source, scheme, key=key, num_partitions=wanted, seed=config.seed)
    available = len(split.partitions)
    if wanted is not None and wanted > available:
        raise ValueError(
            f"--devices {wanted}, but {config.source} splits into {available} "
            f"({scheme}{f' by {key!r}' if key else ''})"
        )
    devices = wanted or available
    shards = {split.device(i): len(split.partitions.indices[i]) for i in range(devices)}
    shape = tuple(int(d) for d in split.x.shape[1:])
    classes = int(split.y.max()) + 1
    groups_in_test = False
    if config.test is not None:
        x_test, y_test = load_recording(config.test, shape, group_key=key or None)
        if tuple(x_test.shape[1:]) != shape:
            raise ValueError(
                f"--test {config.test}: samples of shape {tuple(x_test.shape[1:])}, the "
                f"recording's are {shape}"
            )
        classes = max(classes, int(y_test.max()) + 1)
        groups_in_test = bool(key) and _holds(config.test, key)
        given["eval-data"] = str(config.test.resolve())
        given.setdefault("eval-samples", len(y_test))  # all of it: the held-out score
        if groups_in_test:
            given["eval-group-by"] = key
    given.setdefault("global-batch", SIMULATE_RECORDING_BATCH_PER_DEVICE * devices)
    if "sim-rates" not in given and "sim-population" not in given:
        # One local epoch a round (FedAvg's E = 1): the median device trains about once over
        # its part, and its stream delivers what a round trains on (b x K), from the start.
        per_device = max(1, int(given["global-batch"]) // devices)
        given.setdefault(
            kebab("local_steps"), max(1, round(statistics.median(shards.values()) / per_device))
        )
        per_round = per_device * int(given[kebab("local_steps")])
        round_s = float(given.get("sim-round-s", RunSettings().sim_round_s))
        given["sim-rates"] = f"{per_round / round_s:.6g}"
        given.setdefault("sim-initial", per_round)
    given.setdefault("sim-slowdowns", "1")
    given.update(
        {
            "sim-source": source,
            "sim-partition": str(scheme),
            "sim-partition-by": key,
            kebab("sample_shape"): ",".join(map(str, shape)),
            "num-classes": max(2, classes),
        }
    )
    given.setdefault("model", "cnn" if len(shape) == 2 else "mlp")
    if given.get("task", "classification") == "classification":
        # a recording is in its sensors' units: each device standardises by its own stream
        given.setdefault("preprocess", "standardize")
    settings = RunSettings.from_run_config(given)
    return SimulationPlan(settings, devices, shards, split.partitions.left_out, groups_in_test)


def _holds(path: Path, key: str) -> bool:
    try:
        load_groups(path, key)
    except ValueError:
        return False
    return True


def run_simulation(config: SimulateConfig, console: Console) -> bool:
    """Plan, run and report a simulation; True when it finished all its rounds.

    Raises
    ------
    ValueError, ImportError
        As :func:`plan_simulation`, before anything starts.
    FlowerError
        If Flower cannot be started or the run not submitted.
    """
    plan = plan_simulation(config)
    settings = plan.settings
    run_dir = config.out / time.strftime("sim-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=False)
    _say_plan(config, plan, run_dir, console)
    submitted = {
        **settings.to_run_config(),
        "out-dir": str(run_dir.resolve()),
        "sim-dir": str((run_dir / "sim").resolve()),
    }
    began = time.monotonic()
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, run_dir / "flwr", simulated_nodes=plan.devices)
        flower.start_superlink()
        run_id = flower.submit(APP_DIR, submitted)
        status = _follow(flower, run_id, settings, run_dir, config.live, console)
        (run_dir / "serverapp.log").write_text(flower.logs(run_id))
    every = read_metrics(run_dir / "metrics.jsonl")
    records = rounds_only(every)
    replied = any(r.replied_count for r in records)
    budget = _budget_ended(settings, records)
    ok = (
        status.get("status") == "finished:completed"
        and (len(records) == settings.num_rounds or budget)
        and replied
    )
    summary = {
        **summarize(every, time.monotonic() - began),
        "run_id": run_id,
        "status": status.get("status", "timed out"),
        "devices_simulated": plan.devices,
        "source": str(config.source) if config.source else "synthetic",
        "partition": settings.sim_partition or None,
        "partition_by": settings.sim_partition_by or None,
        "left_out": plan.left_out,
        "test": str(config.test) if config.test else None,
        "run_config": settings.to_run_config(),
        "source_passes": source_passes(records, plan.shards),
        "note": "time on the streams' virtual clock: sim-round-s a round",
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if records:
        write_report(records, run_dir / "report.png", f"fedstream simulate: {run_dir.name}")
    if ok and budget:
        console.print(
            f"the privacy budget ended the run after {len(records)} of "
            f"{settings.num_rounds} rounds: dp-epsilon {settings.privacy.dp_epsilon:g}, "
            f"epsilon {records[-1].dp_epsilon_spent:.3g} spent"
        )
    _say_outcome(ok, replied, summary, run_dir, console)
    return ok


def _budget_ended(settings: RunSettings, records: list[RoundRecord]) -> bool:
    """Whether a differentially private run's budget (``dp-epsilon``) could not pay for the
    round after its last: the run ended there as it should."""
    private = settings.privacy
    if not (private.on and private.dp_epsilon > 0 and records):
        return False
    from aggregator.privacy import epsilon_spent

    fraction = settings.rounds.fraction_train
    return epsilon_spent(private, fraction, len(records) + 1) > private.dp_epsilon


def _say_plan(
    config: SimulateConfig, plan: SimulationPlan, run_dir: Path, console: Console
) -> None:
    settings = plan.settings
    what = "the synthetic task"
    if config.source is not None:
        by = f" by {settings.sim_partition_by}" if settings.sim_partition_by else ""
        what = f"{config.source} ({settings.sim_partition}{by}, each part in recorded order)"
    console.print(
        f"[bold]simulate[/bold]: {plan.devices} virtual devices streaming {what}, "
        f"{settings.num_rounds} rounds, seed {settings.seed}, {settings.sim_round_s:g} s a "
        f"round on the virtual clock; writing {run_dir}"
    )
    if plan.left_out:
        named = ", ".join(f"{g} ({n})" for g, n in sorted(plan.left_out.items()))
        console.print(f"[yellow]left out, too few samples for a device: {named}[/yellow]")
    if config.test is not None and settings.sim_partition_by and not plan.groups_in_test:
        console.print(
            f"[yellow]{config.test} has no {settings.sim_partition_by!r}: scored as a whole, "
            "not per group[/yellow]"
        )


def _follow(
    flower: FlowerDeployment,
    run_id: str,
    settings: RunSettings,
    run_dir: Path,
    live_view: bool,
    console: Console,
) -> dict[str, Any]:
    """Show the rounds as they come until the run ends (or stalls past every round's
    timeout); its last status."""
    rounds = settings.num_rounds
    deadline = time.monotonic() + 300.0 + rounds * (settings.round_timeout + 30.0)
    status: dict[str, Any] = {}
    shown, next_check = -1, 0.0
    with Live(console=console, refresh_per_second=2, transient=not live_view) as live:
        while time.monotonic() < deadline:
            records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
            if time.monotonic() >= next_check or len(records) >= rounds:
                status = flower.status(run_id)
                next_check = time.monotonic() + DEMO_STATUS_CHECK_S
            if len(records) != shown:
                shown = len(records)
                table = progress_table(
                    records, rounds, str(status.get("status", "")), SIMULATE_SHOWN_DEVICES
                )
                if live_view:
                    live.update(table)
                elif records:
                    console.print(table)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(DEMO_STATUS_POLL_S)
    return status


def _say_outcome(
    ok: bool, replied: bool, summary: dict[str, Any], run_dir: Path, console: Console
) -> None:
    metric = summary["metric"] or "score"
    if summary["device_score_mean"] is not None:
        console.print(
            f"devices' {metric} (each one's latest, prequential): mean "
            f"{summary['device_score_mean']:.3f}, median {summary['device_score_median']:.3f}, "
            f"worst 10 % {summary['device_score_worst10']:.3f}"
        )
    if summary["test_accuracy"] is not None:
        console.print(f"held-out {metric}: {summary['test_accuracy']:.3f}")
    by_group: dict[str, float] = summary["test_by_group"]
    if by_group:
        better = bool(summary["higher_is_better"])
        ranked = sorted(by_group, key=by_group.__getitem__, reverse=not better)  # worst first
        console.print(
            f"held-out {metric} per group: mean {statistics.fmean(by_group.values()):.3f}, "
            f"worst {by_group[ranked[0]]:.3f} ({ranked[0]}), best {by_group[ranked[-1]]:.3f} "
            f"({ranked[-1]})"
        )
    passes = summary["source_passes"]
    if passes:
        console.print(
            f"each device streamed its part {min(passes.values()):.1f}-"
            f"{max(passes.values()):.1f} times over (source_passes)"
        )
    if ok:
        console.print(f"[green]done[/green]: {run_dir}/summary.json, report.png, metrics.jsonl")
    elif not replied:
        console.print(
            f"[red]no device replied in any round[/red]: {run_dir}/serverapp.log says why"
        )
    else:
        console.print(
            f"[red]the run ended as {summary['status']}[/red] after {summary['rounds']} rounds: "
            f"{run_dir}/serverapp.log says why"
        )
