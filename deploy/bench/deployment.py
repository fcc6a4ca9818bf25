"""``fedstream bench deployment``: rounds on the wall clock, on Flower's deployment engine.

Every run is a real SuperLink and real SuperNodes on this machine, one after the other: the
plain apps and the ``fedstream-idle`` and ``fedstream-live`` arms on Flower's own
``flower-supernode`` (subprocess isolation, one ClientApp process per message); the
``-agent`` arms and the controller pair with a device agent per device, which takes its
SuperNode's tasks itself (``fedstream-supernode`` in process isolation: no process per
message, :mod:`edge_client.runtime.task_taker`):

- ``plain-flower``: a plain Flower app (:mod:`plain_flower`, in this folder: Flower's
  ``FedAvg`` through ``Strategy.start``, unmodified, a ClientApp that trains fedstream's
  default model on a local array with ``torch.optim.SGD``, no fedstream code);
- ``plain-flower-tuned``: the same with the optimizer's functional form (no
  ``torch._dynamo`` import per message: what fedstream does);
- ``plain-flower-tuned-pull``: plain-flower-tuned whose grid pulls replies every
  :data:`~aggregator.exchange.PULL_INTERVAL_S` seconds, as fedstream's ServerApp does, instead
  of Flower's 3 s (like for like: the rest is ``Strategy.start`` as written);
- ``fedstream-idle``: fedstream's app, its buffers filled before the run, no stream;
- ``fedstream-live``: ``fedstream demo``'s path (broker, publishers, ingest daemons);
- ``controller-fixed`` / ``controller-dynamic``: fedstream-idle with OmniLearn's
  heterogeneity (slowdowns 1, 1, 2, 4) and enough local work for compute to matter, with
  equal batches or with the proportional controller: time to an accuracy both reach.

Every variant runs :data:`REPETITIONS` times, alternated (one of each, then again: the
controller pair over its seeds), so that a slow spell of the shared host falls on every
variant alike; each variant's ratio to each plain one is taken within a repetition, and
reported with its spread over them.

Same nodes, rounds, model, samples per step and central evaluation in each. Per round: the
wall time (the first round, which also installs the app on each SuperNode, is left out of
the median), the ClientApp processes' CPU seconds, and where fedstream's rounds went
(:mod:`deploy.breakdown`). The device footprint (ingest daemon, SuperNode and its
SuperExec, the ClientApp) is read from ``/proc`` while the live run goes.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from aggregator.exchange import PULL_INTERVAL_S
from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from deploy.agents import agent_sockets, start_devices
from deploy.bench.agent import agent_summary
from deploy.bench.common import PROCESS_SOURCES, Result, measured_code, spread
from deploy.bench.curves import batch_per_device, compute_per_device, slowest_share, time_to
from deploy.bench.deployment_goals import goals
from deploy.bench.deployment_table import deployment_table, goals_table
from deploy.bench.processes import DEVICE_ROLES, SAMPLE_S, ProcessSampler
from deploy.breakdown import PARTS, run_breakdown
from deploy.demo import APP_DIR, STATUS_CHECK_S, DemoConfig, run_demo
from deploy.flower import FlowerDeployment, FlowerError
from deploy.local import ProcessGroup
from edge_client.runtime import usage
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import COMMIT_INTERVAL_S
from edge_client.runtime.node_config import NodeConfig
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = [
    "NOOP_APP",
    "PLAIN_APP",
    "QUICK_SOAK_EVERY",
    "QUICK_SOAK_MESSAGES",
    "ProcessSampler",
    "fill_buffers",
    "rerun_controllers",
    "run",
    "samples_for",
    "standing_deployment",
]

log = logging.getLogger(__name__)

PLAIN_APP = Path(__file__).resolve().parent / "plain_flower"
NOOP_APP = Path(__file__).resolve().parent / "noop_flower"
#: What the plain app's timing file holds per round: its wall time, and its ClientApps' mean
#: CPU seconds, process start and training seconds (the keys it reports, as fedstream's).
PLAIN_METRICS = ("wall_s", "cpu_s", "start_s", "train_s")
#: Samples per step on each device, local steps, model width: the comparison's work.
BATCH, STEPS, WIDTH = 32, 20, 32
#: The controller runs: OmniLearn's heterogeneity, and local work that compute dominates
#: (the slowest device trains for most of its round under the fixed split) in rounds short
#: enough that 0.9 takes several of them, so the controller's rounds, not round 1, decide the
#: time to it. Everything else is at the run config's defaults (global batch 512: 128 samples
#: a step per device under the fixed split; aggregation adaptive; controller-probe 1): what a
#: user who turns the controller on gets. Local steps, model width (337k parameters), rounds.
SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
CONTROLLER_STEPS, CONTROLLER_WIDTH, CONTROLLER_ROUNDS = 20, 256, 10
CONTROLLER_SEEDS = (0, 1, 2)
#: Test accuracies whose wall time to reach the controller runs report (and the one all reach).
CONTROLLER_TARGETS = (0.85, 0.9)
#: Alternated repetitions of the comparison's variants (the quick run: one).
REPETITIONS = 3
#: What fedstream's rounds are divided by (the entry's key for each): the plain app as
#: written, and with fedstream's pulls.
BASELINES = {
    "plain-flower-tuned": "vs_plain_tuned",
    "plain-flower-tuned-pull": "vs_plain_tuned_pull",
}
RUN_TIMEOUT_S = 900.0
#: The agent's soak: messages served back to back, and how often (in messages) its resident
#: memory is read.
SOAK_MESSAGES, SOAK_EVERY = 500, 50
#: The quick run's: a soak of 20 messages read every 10, and controller rounds of 4 local
#: steps (what it checks is that every part runs, in minutes; its figures judge nothing).
QUICK_SOAK_MESSAGES, QUICK_SOAK_EVERY, QUICK_CONTROLLER_STEPS = 20, 10, 4
#: A 1 GB Raspberry Pi: the device's processes should leave 40 % of it free.
PI_BYTES = 1 << 30


# -- the runs -------------------------------------------------------------------------------


@dataclass
class _Run:
    """One variant's rounds: wall seconds per round, and per round the ClientApps' mean
    CPU seconds, process start and training seconds."""

    name: str
    wall: list[float]
    cpu: list[float]
    start: list[float]
    train: list[float]
    records: list[RoundRecord] = field(default_factory=list)
    total_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        steady = self.wall[1:] or self.wall
        return {
            "variant": self.name,
            "rounds": len(self.wall),
            "round_wall_s": [round(w, 3) for w in self.wall],
            "round_wall_median_s": round(statistics.median(steady), 3),
            "round_wall_min_s": round(min(steady), 3),
            "round_wall_max_s": round(max(steady), 3),
            "clientapp_cpu_s_per_round": round(statistics.mean(self.cpu), 3) if self.cpu else None,
            "clientapp_start_s": round(statistics.mean(self.start), 3) if self.start else None,
            "clientapp_train_s": round(statistics.mean(self.train), 3) if self.train else None,
            "total_s": round(self.total_s, 1),
            "breakdown": run_breakdown(self.records) if self.records else {},
            **self.extra,
        }


def _fedstream_run(name: str, records: list[RoundRecord], total_s: float) -> _Run:
    def mean_of(r: RoundRecord, key: str) -> float:
        return statistics.mean(float(getattr(m, key)) for m in r.devices.values())

    live = [r for r in records if r.devices]
    agent_cpu = [mean_of(r, "agent_cpu_s") for r in live]
    return _Run(
        name,
        [r.wall_s for r in records],
        [mean_of(r, "cpu_s") for r in live],
        [mean_of(r, "start_s") for r in live],
        [mean_of(r, "train_s") for r in live],
        records,
        total_s,
        extra={"agent_cpu_s_per_message": round(statistics.mean(agent_cpu), 3)}
        if agent_cpu and any(agent_cpu)
        else {},
    )


@contextmanager
def standing_deployment(
    home: Path,
    buffers: dict[str, Path],
    slowdowns: tuple[float, ...] = (1.0,),
    agents: bool = False,
) -> Iterator[FlowerDeployment]:
    """A SuperLink and one SuperNode per buffer (with ``agents``: and one device agent
    each, which takes its SuperNode's tasks), kept for several runs one after the other (the
    plain app reads ``seed`` from the node config, fedstream's the device's keys)."""
    with agent_sockets(agents) as sockets, ProcessGroup() as group:
        flower = FlowerDeployment(group, home)
        flower.start_superlink()
        order = {dev: i for i, dev in enumerate(buffers)}

        def node_config(dev: str, agent: str) -> dict[str, Any]:
            i = order[dev]
            node = NodeConfig(
                dev, str(buffers[dev]), slowdown=slowdowns[i % len(slowdowns)], threads=1
            )
            return {**replace(node, agent=agent).to_node_config(), "seed": i}

        start_devices(flower, buffers, node_config, sockets, home / "logs")
        flower.wait_nodes(len(buffers))
        yield flower


def _finish(flower: FlowerDeployment, run_id: str, done: Callable[[], bool]) -> None:
    """Wait for the run: for ``done`` (its output is all there: cheap to check), asking
    Flower only every :data:`STATUS_CHECK_S` meanwhile (each ``flwr`` call is a process of
    about a CPU-second on the devices' two cores; a run that failed is never done), then
    for Flower to call it finished.

    Raises
    ------
    FlowerError
        If the run did not complete.
    """
    deadline = time.monotonic() + RUN_TIMEOUT_S
    next_check = time.monotonic() + STATUS_CHECK_S
    while not done() and time.monotonic() < deadline:
        if time.monotonic() >= next_check:
            if str(flower.status(run_id).get("status", "")).startswith("finished"):
                break
            next_check = time.monotonic() + STATUS_CHECK_S
        time.sleep(0.5)
    status = flower.wait_finished(run_id, timeout=60.0, interval=1.0)
    if status.get("status") != "finished:completed":
        raise FlowerError(f"run {run_id} did not complete: {status}")


def _plain(
    flower: FlowerDeployment, tmp: Path, rounds: int, optimizer: str, pull_s: float = 0.0
) -> _Run:
    """The plain Flower app on the deployment's SuperNodes (``pull_s``: its grid pulls
    every that many seconds; 0: Flower's own ``send_and_receive``)."""
    timing = tmp / f"plain-{optimizer}-{pull_s:g}-{time.monotonic_ns()}.json"
    started = time.monotonic()
    # The plain app's own run config (its pyproject.toml), in Flower's kebab case.
    config = {
        "num_server_rounds": rounds,
        "min_nodes": len(flower.nodes),
        "local_steps": STEPS,
        "batch_size": BATCH,
        "model_width": WIDTH,
        "optimizer": optimizer,
        "timing_file": str(timing),
        "pull_interval": pull_s,
    }
    run_id = flower.submit(PLAIN_APP, {kebab(k): v for k, v in config.items()})
    _finish(flower, run_id, timing.exists)  # the ServerApp writes it at the end
    total = time.monotonic() - started
    got = json.loads(timing.read_text())["rounds"]
    wall, cpu, start, train = ([r[kebab(key)] for r in got] for key in PLAIN_METRICS)
    name = ("plain-flower" if optimizer == "torch" else "plain-flower-tuned") + (
        "-pull" if pull_s else ""
    )
    return _Run(name, wall, cpu, start, train, total_s=total, extra={"pull_interval_s": pull_s})


def _noop(flower: FlowerDeployment, tmp: Path, rounds: int) -> _Run:
    """Flower's own floor: a ClientApp that imports Flower only and replies at once
    (:mod:`noop_flower`, in this folder), on the deployment's SuperNodes."""
    timing = tmp / f"noop-{time.monotonic_ns()}.json"
    started = time.monotonic()
    config = {"num-server-rounds": rounds, "min-nodes": len(flower.nodes)}
    run_id = flower.submit(NOOP_APP, {**config, "timing-file": str(timing)})
    _finish(flower, run_id, timing.exists)
    got = json.loads(timing.read_text())["rounds"]
    wall, cpu, start, train = ([r[kebab(key)] for r in got] for key in PLAIN_METRICS)
    return _Run("flower-do-nothing", wall, cpu, start, train, total_s=time.monotonic() - started)


def fill_buffers(where: Path, devices: int, samples: int) -> dict[str, Path]:
    """Buffers holding ``samples`` windows of the synthetic task each (no stream)."""
    task = SensorTask()
    paths = {}
    for i in range(devices):
        path = paths[f"dev-{i}"] = where / f"dev-{i}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        x, y = task.sample(samples, np.random.default_rng(100 + i))
        ts = time.time() - samples * 1e-3 + np.arange(samples, dtype=np.float64) * 1e-3
        with BufferStore(path, shape=task.shape, capacity=samples) as store:
            store.append([SampleBatch(x, y, ts)])
    return paths


def samples_for(*settings: RunSettings) -> int:
    """Samples a buffer needs for these runs: enough for a device that trains twice the
    mean batch every round (the controller gives fast devices more)."""
    return 1000 + sum(
        s.num_rounds * s.local_steps * 2 * s.global_batch // s.min_nodes for s in settings
    )


def _settings(devices: int, rounds: int, out: Path, **over: Any) -> RunSettings:
    base: dict[str, Any] = {
        "num_rounds": rounds,
        "min_nodes": devices,
        "global_batch": BATCH * devices,
        "local_steps": STEPS,
        "model_width": WIDTH,
        "eval_data": "synthetic",
        "out_dir": str(out),
        "checkpoint_dir": str(out / "checkpoint"),
    }
    return RunSettings(**{**base, **over})


def _idle(flower: FlowerDeployment, name: str, settings: RunSettings) -> _Run:
    """fedstream's app on the deployment's buffers, filled before the run (no stream); the
    device processes sampled meanwhile (their CPU per round, :func:`_device_cpu`)."""
    started = time.monotonic()
    metrics = Path(settings.out_dir) / "metrics.jsonl"
    sampler = ProcessSampler(mark_when=lambda: len(rounds_only(read_metrics(metrics))) >= 1)
    with sampler.running():
        run_id = flower.submit(APP_DIR, settings.to_run_config())
        _finish(
            flower, run_id, lambda: len(rounds_only(read_metrics(metrics))) >= settings.num_rounds
        )
    records = rounds_only(read_metrics(metrics))  # the probe's exchange is in run-wall-s
    run = _fedstream_run(name, records, time.monotonic() - started)
    run.extra.update(_device_cpu(sampler, records))
    steady = records[1:] or records
    slowest = statistics.median(max(m.compute_s for m in r.devices.values()) for r in steady)
    run.extra["slowest_compute_s"] = round(slowest, 3)
    return run


def _live(
    tmp: Path,
    devices: int,
    rounds: int,
    commit_interval: float = COMMIT_INTERVAL_S,
    rep: int = 0,
    agent: bool = False,
) -> _Run:
    """``fedstream demo``'s path, no slowdowns, with the device processes sampled (the
    ingest daemons committing every ``commit_interval`` seconds at most; with ``agent``, a
    device agent each); ``rep`` numbers the repetition (its own folder)."""
    name = "fedstream-live" + (
        "" if commit_interval == COMMIT_INTERVAL_S else f"-commit-{commit_interval:g}s"
    )
    name += "-agent" if agent else ""
    config = DemoConfig(
        devices=devices,
        out=tmp / f"{name}-{rep}",
        live=False,
        slowdowns=[1.0] * devices,
        commit_interval=commit_interval,
        agent=agent,
        run_config={  # the demo's defaults, but the comparison's work, probing as fedstream-idle
            kebab(k): v
            for k, v in {
                "num_rounds": rounds,
                "global_batch": BATCH * devices,
                "local_steps": STEPS,
                "model_width": WIDTH,
                "controller_probe": 3,
            }.items()
        },
    )

    def first_round_done() -> bool:  # the steady state starts after round 1
        runs = config.out.glob("*/metrics.jsonl")
        return any(len(rounds_only(read_metrics(m))) >= 1 for m in runs)

    sampler = ProcessSampler(mark_when=first_round_done)
    started = time.monotonic()
    with sampler.running():
        ok = run_demo(config, Console(file=io.StringIO()))
    if not ok:
        raise FlowerError(f"the live run did not finish; see its logs under {config.out}")
    run_dir = next(config.out.glob("run-*"))
    run = _fedstream_run(name, rounds_only(read_metrics(run_dir / "metrics.jsonl")), 0.0)
    run.total_s = time.monotonic() - started
    run.extra["commit_interval_s"] = commit_interval
    run.extra["footprint"] = _footprint(sampler, run.records, run_dir)
    return run


def _footprint(
    sampler: ProcessSampler, records: list[RoundRecord], run_dir: Path
) -> dict[str, Any]:
    """What one device ran, together: its memory, and what it wrote per accepted sample.

    Memory two ways: the largest proportional set size (PSS) of a device's processes at
    one instant (pages they share, such as the interpreter's, counted once: what the device
    needs), and the sum of each process's own peak resident memory (an upper bound: peaks at
    different times, shared pages counted in each).
    """
    roles = sampler.by_role()
    replies = [m for r in records for m in r.devices.values()]
    devices = max(1, len({d for r in records for d in r.devices}))
    resident = {role: int(roles.get(role, {}).get("peak_rss", 0)) for role in DEVICE_ROLES}
    resident["clientapp"] = max((m.peak_rss for m in replies), default=0)
    accepted, sample_bytes = 0, 0
    for path in (run_dir / "buffers").glob("dev-*.sqlite"):
        with BufferStore(path) as store:
            accepted += int(store.stats()["accepted"])
            sample_bytes = store.sample_bytes
    written = {role: roles.get(role, {}).get("written", 0.0) * devices for role in DEVICE_ROLES}
    written["clientapp"] = float(sum(m.write_bytes for m in replies))
    per_sample = sum(written.values()) / accepted if accepted else None
    cpu = _device_cpu(sampler, records)
    return {
        "pss_peak_bytes": sampler.device_pss_peak,
        "pi_1gb_headroom": round(1 - sampler.device_pss_peak / PI_BYTES, 3),
        "peak_rss_bytes": resident,
        "peak_rss_sum_bytes": sum(resident.values()),
        "pi_1gb_headroom_rss_sum": round(1 - sum(resident.values()) / PI_BYTES, 3),
        "accepted_samples": accepted,
        "written_bytes": {k: int(v) for k, v in written.items()},
        "written_per_accepted_sample": None if per_sample is None else round(per_sample),
        "sample_bytes": sample_bytes,
        "write_amplification": (
            None if per_sample is None or not sample_bytes else round(per_sample / sample_bytes, 2)
        ),
        "cpu_s_while_sampled": {k: round(v["cpu_s"], 2) for k, v in roles.items()},
        **cpu,
        # Processes that had torch mapped, by role; a ClientApp seen for a moment only may
        # be missed (sampled every SAMPLE_S).
        "torch_processes": {k: int(v["with_torch"]) for k, v in roles.items()},
        "processes_seen": {k: int(v["processes"]) for k, v in roles.items()},
    }


def _device_cpu(sampler: ProcessSampler, records: list[RoundRecord]) -> dict[str, Any]:
    """A device's CPU seconds per round in the steady state (after round 1: start-ups left
    out), all its processes: the long-lived ones (SuperNode, SuperExec, agent, ingest) as
    sampled since the end of round 1, idle polling included, and each later message's
    ClientApp process as it reports itself (its whole life); the training's part is what the
    agents or ClientApps spent in the handler's local steps (``train_s`` at one thread)."""
    roles = sampler.by_role()
    devices = max(1, len({d for r in records for d in r.devices}))
    lasting = sum(roles[r]["cpu_s_after_mark"] for r in DEVICE_ROLES if r in roles) / devices
    later = [m for r in records[1:] for m in r.devices.values()]
    steady_rounds = max(1, len(records) - 1)
    clientapps = sum(m.cpu_s for m in later) / devices
    return {
        "device_cpu_s_per_round": round((lasting + clientapps) / steady_rounds, 3),
        "device_cpu_s_per_round_parts": {
            "long-lived": round(lasting / steady_rounds, 3),
            "clientapps": round(clientapps / steady_rounds, 3),
        },
    }


# -- the scenario ---------------------------------------------------------------------------


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """Every variant, the compared ones :data:`REPETITIONS` times alternated; the table and
    the JSON entries (one per run, ``repetition`` numbering the compared ones).

    Each repetition starts a SuperLink and its SuperNodes for Flower's do-nothing app, the
    plain apps and fedstream-idle, another whose SuperNodes name a device agent each for
    fedstream-idle-agent, then the live runs (the demo's own processes), without and with
    agents; the controller pair gets another (its SuperNodes slowed down, agents on); last,
    an agent's soak. ``quick``: 2 devices and 2 rounds everywhere, one repetition (the
    controller pair: slowdowns 1 and 4, :data:`QUICK_CONTROLLER_STEPS` local steps), a soak of
    :data:`QUICK_SOAK_MESSAGES` messages.
    """
    devices, rounds = (2, 2) if quick else (4, 6)
    repetitions = 1 if quick else REPETITIONS
    runs: list[_Run] = []

    def timed(label: str, step: Callable[[], _Run], repetition: int | None = None) -> _Run:
        began = time.monotonic()
        runs.append(step())
        if repetition is not None:
            runs[-1].extra["repetition"] = repetition
        progress(f"  {label}: {time.monotonic() - began:.0f} s")
        return runs[-1]

    with tempfile.TemporaryDirectory(prefix="fedstream-bench-deploy-") as name:
        tmp = Path(name)
        idle = [_settings(devices, rounds, tmp / f"idle-{k}") for k in range(repetitions)]
        agent = [_settings(devices, rounds, tmp / f"agent-{k}") for k in range(repetitions)]
        buffers = fill_buffers(tmp / "buffers", devices, samples_for(*idle, *agent))
        for k in range(repetitions):
            progress(f" repetition {k + 1} of {repetitions}")
            with standing_deployment(tmp / f"flwr-{k}", buffers) as flower:
                timed("Flower's do-nothing app", functools.partial(_noop, flower, tmp, rounds), k)
                for pull in (0.0, PULL_INTERVAL_S):
                    plain = functools.partial(_plain, flower, tmp, rounds, "functional", pull)
                    timed(f"plain (functional, pulls {pull or 3:g} s)", plain, k)
                run_idle = functools.partial(_idle, flower, "fedstream-idle", idle[k])
                timed("fedstream-idle", run_idle, k)
            with standing_deployment(tmp / f"flwr-agent-{k}", buffers, agents=True) as flower:
                run_agent = functools.partial(_idle, flower, "fedstream-idle-agent", agent[k])
                timed("fedstream-idle-agent", run_agent, k)
            for with_agent in (False, True):
                live = functools.partial(_live, tmp, devices, rounds, rep=k, agent=with_agent)
                timed("fedstream-live" + ("-agent" if with_agent else ""), live, k)
        _controllers(tmp, devices, quick, timed)
        soak = _soak(
            tmp,
            *((QUICK_SOAK_MESSAGES, QUICK_SOAK_EVERY) if quick else (SOAK_MESSAGES, SOAK_EVERY)),
            progress,
        )
    _judge_controllers(runs, _slowdowns(quick))
    entries = [r.entry() for r in runs]
    _add_ratios(entries)
    meta = {
        **_meta(quick, devices, rounds),
        "repetitions": repetitions,
        "ratios": _ratio_summary(entries),
        "agent": agent_summary(entries),
        "soak": soak,
        "controllers": _controller_summary(entries),
    }
    meta["goals"] = goals(entries, soak)
    table = deployment_table(entries, meta["ratios"]) + "\n\n" + goals_table(meta["goals"])
    return Result("deployment", entries, table, meta, sources=PROCESS_SOURCES)


def _controllers(
    tmp: Path, devices: int, quick: bool, timed: Callable[[str, Callable[[], _Run]], _Run]
) -> None:
    """The controllers in wall time, with agents taking their tasks, seeds alternating
    them: ``fixed`` (the equal split) and ``dynamic`` (the proportional controller), every
    key at its default but the controller, the work (:data:`CONTROLLER_STEPS`,
    :data:`CONTROLLER_WIDTH`), the rounds and the seed; the dynamic arm's timing probe
    (``controller-probe``, an exchange before round 1) is charged to its time."""
    slowdowns = _slowdowns(quick)
    plans = [
        (
            f"controller-{name}",
            seed,
            RunSettings(
                num_rounds=2 if quick else CONTROLLER_ROUNDS,
                min_nodes=devices,
                controller=name,
                local_steps=QUICK_CONTROLLER_STEPS if quick else CONTROLLER_STEPS,
                model_width=CONTROLLER_WIDTH,
                seed=seed,
                eval_data="synthetic",
                out_dir=str(tmp / f"controller-{name}-{seed}"),
                checkpoint_dir=str(tmp / f"controller-{name}-{seed}" / "checkpoint"),
            ),
        )
        for seed in ((0,) if quick else CONTROLLER_SEEDS)
        for name in ("fixed", "dynamic")
    ]
    needed = samples_for(*(settings for _, _, settings in plans))
    buffers = fill_buffers(tmp / "controller-buffers", devices, needed)
    with standing_deployment(tmp / "flwr-controller", buffers, slowdowns, agents=True) as flower:
        for label, seed, settings in plans:
            run_it = functools.partial(_idle, flower, label, settings)
            timed(f"{label} (seed {seed})", run_it).extra["seed"] = seed


def _slowdowns(quick: bool) -> tuple[float, ...]:
    """The controller runs' devices' slowdowns (the quick run's two devices: 1 and 4)."""
    return (1.0, 4.0) if quick else SLOWDOWNS


def _judge_controllers(runs: list[_Run], slowdowns: Sequence[float]) -> None:
    """The controller runs' curves and what is read off them (time to each target, and to
    the accuracy every one of them reaches; batches, compute and training share per round)."""
    compared = [r for r in runs if r.name.startswith("controller-")]
    common = round(min(max(r.test_accuracy for r in x.records) for x in compared), 4)
    for r in compared:
        r.extra["time_to_s"] = {
            str(t): time_to(r.records, t) for t in (*CONTROLLER_TARGETS, common)
        }
        r.extra["common_target"] = common
        r.extra["curve"] = [[x.run_wall_s, round(x.test_accuracy, 4)] for x in r.records]
        r.extra["slowdowns"] = list(slowdowns)
        r.extra["compute_s_per_device"] = compute_per_device(r.records)
        r.extra["batch_per_device"] = batch_per_device(r.records)
        r.extra["slowest_training_share"] = slowest_share(r.records, len(slowdowns))


def rerun_controllers(doc: dict[str, Any], progress: Callable[[str], None] = print) -> Result:
    """Run the controller comparison again (not quick) and put it in place of ``doc``'s (a
    ``deployment.json`` as read), the other runs kept: the part to re-run when only the
    controller changed (about 25 minutes, against 50 for the whole scenario)."""
    runs: list[_Run] = []

    def timed(label: str, step: Callable[[], _Run]) -> _Run:
        began = time.monotonic()
        runs.append(step())
        progress(f"  {label}: {time.monotonic() - began:.0f} s")
        return runs[-1]

    with tempfile.TemporaryDirectory(prefix="fedstream-bench-controllers-") as name:
        _controllers(Path(name), doc["devices"], False, timed)
    _judge_controllers(runs, SLOWDOWNS)
    kept = [e for e in doc["entries"] if not e["variant"].startswith("controller-")]
    entries = [*kept, *(r.entry() for r in runs)]
    _add_ratios(entries)
    # The other runs keep their own date, commit and sources (the file's); the re-run
    # section records its own, which `dev/bench_results.py --check` holds it to.
    meta = {k: v for k, v in doc.items() if k not in ("scenario", "entries")}
    meta.setdefault("sources", None)  # a file from before sources were recorded: unknown
    meta.setdefault("machine", None)
    meta["controllers-run"] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **measured_code(PROCESS_SOURCES),
    }
    meta["controllers"] = _controller_summary(entries)
    meta["goals"] = goals(entries, doc["soak"])
    table = deployment_table(entries, meta["ratios"])
    return Result("deployment", entries, table, meta, sources=PROCESS_SOURCES)


def _soak(tmp: Path, messages: int, every: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """One device's agent taking ``messages`` tasks from a real SuperNode, back to back (a
    run of that many rounds of 2 steps of :data:`BATCH` samples): its resident memory after
    the first round and every ``every`` rounds (flat when nothing leaks)."""
    settings = _settings(1, messages, tmp / "soak-out", local_steps=2)
    buffers = fill_buffers(tmp / "soak", 1, messages * BATCH * 2 + 1000)
    metrics = Path(settings.out_dir) / "metrics.jsonl"
    rss: list[list[int]] = []
    with standing_deployment(tmp / "flwr-soak", buffers, agents=True) as flower:
        pid = flower.group.procs["agent-dev-0"].pid
        stop = threading.Event()

        def watch() -> None:
            due = 1
            while not stop.wait(SAMPLE_S) and due <= messages:
                done = len(rounds_only(read_metrics(metrics)))
                if done >= due:
                    rss.append([done, usage.rss_bytes(pid)])
                    mib = rss[-1][1] / 2**20
                    progress(f"  agent soak: {done} messages, resident {mib:.0f} MiB")
                    due = every * (done // every + 1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            run_id = flower.submit(APP_DIR, settings.to_run_config())
            _finish(flower, run_id, lambda: len(rounds_only(read_metrics(metrics))) >= messages)
        finally:
            stop.set()
            watcher.join()
        if not rss or rss[-1][0] < messages:  # the run ended between two reads
            rss.append([len(rounds_only(read_metrics(metrics))), usage.rss_bytes(pid)])
    records = rounds_only(read_metrics(metrics))
    first, warm, last = rss[0][1], rss[min(1, len(rss) - 1)][1], rss[-1][1]
    return {
        "messages": len(records),
        "rss_bytes": rss,
        "rss_growth_after_first_bytes": last - first,
        "rss_growth_after_warmup_bytes": last - warm,
        "rss_growth_after_warmup": round((last - warm) / warm, 4),
        "round_s_median": round(statistics.median(r.wall_s for r in records), 3),
        "steps_per_message": 2,
        "batch": BATCH,
        "path": "SuperLink -> fedstream-supernode (process isolation) -> agent taking tasks",
    }


def _add_ratios(entries: list[dict[str, Any]]) -> None:
    """Each entry's median round over each baseline's of the same repetition (the keys of
    :data:`BASELINES`; entries outside the repetitions: over the first's)."""
    medians = {
        (e["variant"], e["repetition"]): e["round_wall_median_s"]
        for e in entries
        if "repetition" in e
    }
    for e in entries:
        k = e.get("repetition", 0)
        for base, key in BASELINES.items():
            e[key] = round(e["round_wall_median_s"] / medians[(base, k)], 3)


def _ratio_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per compared variant and baseline: the ratio in each repetition, and their mean, min
    and max."""
    out: dict[str, Any] = {}
    for variant in dict.fromkeys(e["variant"] for e in entries if "repetition" in e):
        of = [e for e in entries if e["variant"] == variant and "repetition" in e]
        out[variant] = {}
        for base, key in BASELINES.items():
            ratios = [e[key] for e in of]
            out[variant][base] = {
                "per_repetition": ratios,
                "mean": round(statistics.mean(ratios), 3),
                "min": min(ratios),
                "max": max(ratios),
            }
    return out


def _controller_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per controller, over its seeds: the median round and the time to each target."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(e["variant"] for e in entries if "time_to_s" in e):
        of = [e for e in entries if e["variant"] == name]
        out[name] = {
            "seeds": [e["seed"] for e in of],
            "round_wall_median_s": spread([e["round_wall_median_s"] for e in of]),
            "time_to_s": {t: spread([e["time_to_s"][t] for e in of]) for t in of[0]["time_to_s"]},
        }
    return out


def _meta(quick: bool, devices: int, rounds: int) -> dict[str, Any]:
    return {
        "quick": quick,
        "devices": devices,
        "rounds": rounds,
        "batch_per_device": BATCH,
        "local_steps": STEPS,
        "model_width": WIDTH,
        "controller_local_steps": CONTROLLER_STEPS,
        "controller_model_width": CONTROLLER_WIDTH,
        "controller_settings": "run-config defaults but controller, local-steps, model-width, "
        "num-rounds, seed",
        "clock": "wall clock, Flower's deployment engine on this machine (2 cores shared)",
        "parts": list(PARTS),
    }
