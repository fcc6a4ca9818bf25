"""``fedstream bench deployment``: rounds on the wall clock, on Flower's deployment engine.

Every run is a real SuperLink and real SuperNodes on this machine (subprocess isolation,
one ClientApp process per message, as deployed), one after the other:

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
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from aggregator.exchange import PULL_INTERVAL_S
from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from deploy.bench.common import Result, markdown_table, spread
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

__all__ = ["PLAIN_APP", "ProcessSampler", "run"]

log = logging.getLogger(__name__)

PLAIN_APP = Path(__file__).resolve().parent / "plain_flower"
#: What the plain app's timing file holds per round: its wall time, and its ClientApps' mean
#: CPU seconds, process start and training seconds (the keys it reports, as fedstream's).
PLAIN_METRICS = ("wall_s", "cpu_s", "start_s", "train_s")
#: Samples per step on each device, local steps, model width: the comparison's work.
BATCH, STEPS, WIDTH = 32, 20, 32
#: The controller runs: OmniLearn's heterogeneity, and local work that compute dominates.
SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
CONTROLLER_STEPS, CONTROLLER_WIDTH = 100, 96
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
#: How often the sampler reads the processes.
SAMPLE_S = 0.5
#: What a device runs besides its ClientApp processes.
DEVICE_ROLES = ("ingest", "supernode", "superexec")
#: A 1 GB Raspberry Pi: the device's processes should leave 40 % of it free.
PI_BYTES = 1 << 30


# -- reading the processes -----------------------------------------------------------------


@dataclass
class _Seen:
    """One sampled process: its role, its CPU seconds and bytes written when first seen, and
    the largest CPU seconds, peak resident bytes and bytes written read since."""

    role: str
    cpu0: float
    cpu: float = 0.0
    peak: int = 0
    written0: int = 0
    written: int = 0


@dataclass
class ProcessSampler:
    """Reads the processes this one started, every :data:`SAMPLE_S`, by role (what the
    command line runs): CPU seconds, peak resident memory and bytes written while sampled.

    Short-lived ClientApp processes report their own figures in their replies; this is for
    the long-lived ones (ingest daemon, SuperNode, SuperExec).
    """

    roles: dict[str, str] = field(
        default_factory=lambda: {
            "flower-supernode": "supernode",
            "flower-superexec": "superexec",
            "flwr-clientapp": "clientapp",
            " ingest ": "ingest",
            " publish ": "publisher",
            "flower-superlink": "superlink",
            "flwr-serverapp": "serverapp",
        }
    )
    seen: dict[int, _Seen] = field(default_factory=dict)
    #: The largest memory the device processes held at one instant, per device (PSS).
    device_pss_peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _role(self, pid: int) -> str | None:
        try:
            cmd = " " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        for needle, role in self.roles.items():
            if needle in cmd:
                return role
        return None

    def sample(self) -> None:
        """Read every live descendant of this process once."""
        together = 0
        for pid in usage.children(os.getpid()):
            entry = self.seen.get(pid)
            if entry is None:
                role = self._role(pid)
                if role is None:
                    continue
                if role == "superexec" and self._role(usage.parent(pid)) != "supernode":
                    role = "superlink-superexec"  # the one that runs the ServerApp
                entry = self.seen[pid] = _Seen(
                    role, usage.cpu_s(pid, reaped=False), written0=usage.disk_write_bytes(pid)
                )
            entry.cpu = max(entry.cpu, usage.cpu_s(pid, reaped=False))
            entry.peak = max(entry.peak, usage.peak_rss_bytes(pid))
            entry.written = max(entry.written, usage.disk_write_bytes(pid))
            if entry.role in (*DEVICE_ROLES, "clientapp"):
                together += usage.pss_bytes(pid)
        devices = sum(1 for e in self.seen.values() if e.role == "supernode")
        self.device_pss_peak = max(self.device_pss_peak, together // max(1, devices))

    @contextmanager
    def running(self) -> Iterator[ProcessSampler]:
        """Sample in a thread while the block runs."""

        def loop() -> None:
            while not self._stop.wait(SAMPLE_S):
                self.sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def by_role(self) -> dict[str, dict[str, float]]:
        """Per role: processes, mean CPU seconds and bytes written while sampled, and the
        largest peak resident memory."""
        out: dict[str, dict[str, float]] = {}
        for role in sorted({e.role for e in self.seen.values()}):
            of = [e for e in self.seen.values() if e.role == role]
            out[role] = {
                "processes": len(of),
                "cpu_s": statistics.mean(e.cpu - e.cpu0 for e in of),
                "peak_rss": max(e.peak for e in of),
                "written": statistics.mean(e.written - e.written0 for e in of),
            }
        return out


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
    return _Run(
        name,
        [r.wall_s for r in records],
        [mean_of(r, "cpu_s") for r in live],
        [mean_of(r, "start_s") for r in live],
        [mean_of(r, "train_s") for r in live],
        records,
        total_s,
    )


@contextmanager
def _deployment(
    home: Path, buffers: dict[str, Path], slowdowns: tuple[float, ...] = (1.0,)
) -> Iterator[FlowerDeployment]:
    """A SuperLink and one SuperNode per buffer, kept for several runs one after the other
    (the plain app reads ``seed`` from the node config, fedstream's the device's keys)."""
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, home)
        flower.start_superlink()
        for i, (dev, path) in enumerate(buffers.items()):
            node = NodeConfig(dev, str(path), slowdown=slowdowns[i % len(slowdowns)], threads=1)
            flower.start_supernode(dev, {**node.to_node_config(), "seed": i})
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


def _fill_buffers(where: Path, devices: int, samples: int) -> dict[str, Path]:
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


def _samples_for(*settings: RunSettings) -> int:
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
    """fedstream's app on the deployment's buffers, filled before the run (no stream)."""
    started = time.monotonic()
    metrics = Path(settings.out_dir) / "metrics.jsonl"
    run_id = flower.submit(APP_DIR, settings.to_run_config())
    _finish(flower, run_id, lambda: len(rounds_only(read_metrics(metrics))) >= settings.num_rounds)
    records = rounds_only(read_metrics(metrics))  # the probe's exchange is in run-wall-s
    return _fedstream_run(name, records, time.monotonic() - started)


def _live(
    tmp: Path,
    devices: int,
    rounds: int,
    commit_interval: float = COMMIT_INTERVAL_S,
    rep: int = 0,
) -> _Run:
    """``fedstream demo``'s path, no slowdowns, with the device processes sampled (the
    ingest daemons committing every ``commit_interval`` seconds at most); ``rep`` numbers
    the repetition (its own folder)."""
    name = "fedstream-live" + (
        "" if commit_interval == COMMIT_INTERVAL_S else f"-commit-{commit_interval:g}s"
    )
    config = DemoConfig(
        devices=devices,
        out=tmp / f"{name}-{rep}",
        live=False,
        slowdowns=[1.0] * devices,
        commit_interval=commit_interval,
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
    sampler = ProcessSampler()
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
    }


def _compute_per_device(records: list[RoundRecord]) -> dict[str, list[float]]:
    """Each device's steady-state compute seconds, round by round."""
    names = sorted({d for r in records for d in r.devices})
    return {d: [round(r.devices[d].compute_s, 3) for r in records if d in r.devices] for d in names}


def _batch_per_device(records: list[RoundRecord]) -> dict[str, list[int]]:
    """Each device's trained batch, round by round."""
    names = sorted({d for r in records for d in r.devices})
    return {d: [r.devices[d].batch_size for r in records if d in r.devices] for d in names}


def _time_to(records: list[RoundRecord], target: float) -> float | None:
    return next((r.run_wall_s for r in records if r.test_accuracy >= target), None)


# -- the scenario ---------------------------------------------------------------------------


def run(quick: bool = False, progress: Callable[[str], None] = print) -> Result:
    """Every variant, the compared ones :data:`REPETITIONS` times alternated; the table and
    the JSON entries (one per run, ``repetition`` numbering the compared ones).

    Each repetition starts a SuperLink and its SuperNodes for the plain apps and
    fedstream-idle, then the live run (the demo's own processes); the controller pair gets
    another (its SuperNodes slowed down). ``quick``: 2 devices and 2 rounds everywhere, one
    repetition (the controller pair: slowdowns 1 and 4), without the plain app's untuned
    form and the old commit interval.
    """
    devices, rounds = (2, 2) if quick else (4, 6)
    controller_rounds = 2 if quick else 8
    slowdowns = (1.0, 4.0) if quick else SLOWDOWNS
    repetitions = 1 if quick else REPETITIONS
    runs: list[_Run] = []

    def timed(label: str, step: Callable[[], _Run], repetition: int | None = None) -> None:
        began = time.monotonic()
        runs.append(step())
        if repetition is not None:
            runs[-1].extra["repetition"] = repetition
        progress(f"  {label}: {time.monotonic() - began:.0f} s")

    with tempfile.TemporaryDirectory(prefix="fedstream-bench-deploy-") as name:
        tmp = Path(name)
        idle = [_settings(devices, rounds, tmp / f"idle-{k}") for k in range(repetitions)]
        buffers = _fill_buffers(tmp / "buffers", devices, _samples_for(*idle))
        for k in range(repetitions):
            progress(f" repetition {k + 1} of {repetitions}")
            with _deployment(tmp / f"flwr-{k}", buffers) as flower:
                if not quick:  # the untuned form: what the optimizer's import costs
                    untuned = functools.partial(_plain, flower, tmp, rounds, "torch")
                    timed("plain (torch)", untuned, k)
                for pull in (0.0, PULL_INTERVAL_S):
                    plain = functools.partial(_plain, flower, tmp, rounds, "functional", pull)
                    timed(f"plain (functional, pulls {pull or 3:g} s)", plain, k)
                run_idle = functools.partial(_idle, flower, "fedstream-idle", idle[k])
                timed("fedstream-idle", run_idle, k)
            timed("fedstream-live", functools.partial(_live, tmp, devices, rounds, rep=k), k)
            if not quick:  # the ingest daemon's commits as they were before: every 10 ms
                old = functools.partial(_live, tmp, devices, rounds, 0.01, rep=k)
                timed("fedstream-live (10 ms commits)", old, k)
        # The dynamic controller probes each device's speed before round 1 (by default: one
        # more Flower exchange); without the probe, round 1 splits B equally, as fixed does.
        controllers = {"fixed": ("fixed", 3), "dynamic": ("dynamic", 3)}
        if not quick:
            controllers["dynamic-no-probe"] = ("dynamic", 0)
        plans = [
            (
                f"controller-{name}",
                seed,
                _settings(
                    devices,
                    controller_rounds,
                    tmp / f"controller-{name}-{seed}",
                    controller=controller,
                    controller_probe=probe,
                    local_steps=CONTROLLER_STEPS,
                    model_width=CONTROLLER_WIDTH,
                    seed=seed,
                ),
            )
            for seed in ((0,) if quick else CONTROLLER_SEEDS)
            for name, (controller, probe) in controllers.items()
        ]
        needed = _samples_for(*(settings for _, _, settings in plans))
        buffers = _fill_buffers(tmp / "controller-buffers", devices, needed)
        with _deployment(tmp / "flwr-controller", buffers, slowdowns) as flower:
            for label, seed, settings in plans:  # seeds alternate the controllers
                run_it = functools.partial(_idle, flower, label, settings)
                timed(f"{label} (seed {seed})", run_it)
                runs[-1].extra["seed"] = seed
    compared = [r for r in runs if r.name.startswith("controller-")]
    # The accuracy every one of them reaches, besides the fixed targets.
    common = round(min(max(r.test_accuracy for r in x.records) for x in compared), 4)
    for r in compared:
        r.extra["time_to_s"] = {
            str(t): _time_to(r.records, t) for t in (*CONTROLLER_TARGETS, common)
        }
        r.extra["common_target"] = common
        r.extra["curve"] = [[x.run_wall_s, round(x.test_accuracy, 4)] for x in r.records]
        r.extra["slowdowns"] = list(slowdowns)
        r.extra["compute_s_per_device"] = _compute_per_device(r.records)
        r.extra["batch_per_device"] = _batch_per_device(r.records)
    entries = [r.entry() for r in runs]
    _add_ratios(entries)
    meta = {
        **_meta(quick, devices, rounds),
        "repetitions": repetitions,
        "ratios": _ratio_summary(entries),
        "controllers": _controller_summary(entries),
    }
    return Result("deployment", entries, _table(entries, meta["ratios"]), meta)


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
        "clock": "wall clock, Flower's deployment engine on this machine (2 cores shared)",
        "parts": list(PARTS),
    }


def _times(entry: dict[str, Any]) -> str:
    """Seconds to each target accuracy (``-``: not reached), for the controller runs."""
    if "time_to_s" not in entry:
        return "-"
    return ", ".join(
        f"{t}: {'-' if v is None else f'{v:.0f} s'}" for t, v in entry["time_to_s"].items()
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(entries: list[dict[str, Any]], ratios: dict[str, Any] | None = None) -> str:
    """One row per run; with ``ratios`` (the JSON's), their summary over the repetitions."""
    rows = []
    for e in entries:
        b = e.get("breakdown") or {}
        rows.append(
            [
                e["variant"],
                str(e.get("repetition", "-")),
                f"{e['round_wall_median_s']:.2f} ({e['round_wall_min_s']:.2f}-"
                f"{e['round_wall_max_s']:.2f})",
                f"{e['vs_plain_tuned']:.2f}x",
                f"{e['vs_plain_tuned_pull']:.2f}x" if "vs_plain_tuned_pull" in e else "-",
                _num(e["clientapp_cpu_s_per_round"]),
                _num(e["clientapp_start_s"]),
                _num(e["clientapp_train_s"]),
                f"{100 * b['training_share']:.0f} %" if b else "-",
                str(e.get("seed", "-")),
                _times(e),
            ]
        )
    table = markdown_table(
        [
            "variant",
            "repetition",
            "round wall s, median (range)",
            "vs plain tuned",
            "vs plain tuned, 0.2 s pulls",
            "ClientApp CPU s",
            "process start s",
            "train s",
            "training share",
            "seed",
            "wall s to test accuracy",
        ],
        rows,
    )
    if ratios:
        table += "\n\n" + ratio_table(ratios)
    return table


def ratio_table(ratios: dict[str, Any]) -> str:
    """The median round of each compared variant over each baseline's, within each
    repetition: mean (min-max) over them."""
    rows = [
        [
            variant,
            *(
                f"{r['mean']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, {len(r['per_repetition'])})"
                for r in by_base.values()
            ),
        ]
        for variant, by_base in ratios.items()
    ]
    headers = ["variant"] + [f"vs {base}, mean (min-max, repetitions)" for base in BASELINES]
    return markdown_table(headers, rows)
