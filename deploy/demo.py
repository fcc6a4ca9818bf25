"""``fedstream demo``: everything on one machine, with a live view and a summary.

A broker, one publisher and one ingest daemon per simulated device, each device's buffer
filling at its own rate (:func:`run_stream_demo`: that alone); then Flower's SuperLink, a
SuperNode per device and a run trained on the buffers (:func:`run_demo`). Every process it
starts is stopped (by pid) when it ends, whatever happens.

Its parts: the options (:mod:`deploy.demo_config`), the streams
(:mod:`deploy.demo_streams`), following the run and its faults (:mod:`deploy.demo_follow`),
what it shows (:mod:`deploy.demo_view`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from deploy.agents import agent_sockets, start_devices
from deploy.constants import (
    APP_DIR,
    DEMO_DRAIN_TIMEOUT_S,
    DEMO_MODELS,
    DEMO_PUBLISH_FOREVER_S,
    DEMO_STATUS_CHECK_S,
)
from deploy.demo_config import DemoConfig, device_ids
from deploy.demo_follow import follow_run
from deploy.demo_streams import (
    arrived_counter,
    demo_broker,
    last_json,
    per_reading,
    read_stats,
    start_ingest,
    start_publisher,
    stream_table,
    wait_drained,
    write_shards,
)
from deploy.demo_view import (
    breakdown_line,
    divergence_line,
    final_export,
    infer_command,
    progress_table,
    run_diverged,
    source_passes,
    what_streams,
)
from deploy.flower import FlowerDeployment, FlowerError
from deploy.local import ProcessGroup
from deploy.report import summarize, write_report
from deploy.secure import RunSecrets, make_run_secrets
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.node_config import NodeConfig
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = ["APP_DIR", "STATUS_CHECK_S", "DemoConfig", "run_demo", "run_stream_demo"]

#: How often the run's status is asked for (``deploy.bench`` waits as long).
STATUS_CHECK_S = DEMO_STATUS_CHECK_S


def run_stream_demo(config: DemoConfig, console: Console) -> bool:
    """The streaming half alone; True when every published sample arrived exactly once.

    Writes ``<out>/stream-<time>/`` with the buffers, logs and ``summary.json``.
    """
    assert config.rates is not None
    run_id = datetime.now(UTC).strftime("stream-%Y%m%d-%H%M%S")
    run_dir = config.out / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    devices = device_ids(config.devices)
    paths = {dev: run_dir / "buffers" / f"{dev}.sqlite" for dev in devices}
    stores: dict[str, BufferStore] = {}
    published: dict[str, int] = {}
    ingest_rc: dict[str, int | None] = {}
    start = time.monotonic()
    secrets = make_run_secrets(run_dir / "secrets", devices) if config.secure else None
    write_shards(config, run_dir)
    with demo_broker(config, console, secrets) as streams, ProcessGroup() as group:
        start_ingest(group, config, streams, paths, run_dir)
        pubs = {
            dev: start_publisher(group, config, streams, i, dev, run_dir, config.duration)
            for i, dev in enumerate(devices)
        }
        console.print(
            f"[bold]{config.devices} devices[/bold] streaming for {config.duration:.0f} s "
            f"into {run_dir / 'buffers'} ({config.policy}, capacity {config.capacity})"
        )
        start = time.monotonic()
        deadline = start + config.duration + 120.0
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            last_line = 0.0
            while any(p.poll() is None for p in pubs.values()) and time.monotonic() < deadline:
                stats = read_stats(paths, stores)
                elapsed = time.monotonic() - start
                if config.live:
                    live.update(stream_table(config, stats, {}, elapsed, "streaming"))
                elif elapsed - last_line >= 5.0:
                    console.print(stream_table(config, stats, {}, elapsed, "streaming"))
                    last_line = elapsed
                time.sleep(0.5)
        for dev, proc in pubs.items():
            out, _ = proc.communicate(timeout=DEMO_DRAIN_TIMEOUT_S)
            report = last_json(out.decode(errors="replace"))
            published[dev] = int(report["samples"]) if report else -1
            group.procs.pop(f"publish-{dev}", None)
        counted = {dev: n * per_reading(config) for dev, n in published.items()}
        wait_drained(paths, stores, counted, DEMO_DRAIN_TIMEOUT_S, arrived_counter(config))
        for dev in devices:
            ingest_rc[dev] = group.stop(f"ingest-{dev}")
    stats = read_stats(paths, stores)
    for store in stores.values():
        store.close()
    elapsed = time.monotonic() - start
    console.print(stream_table(config, stats, published, elapsed, "final"))
    console.print("rate/s is the ingest daemon's EWMA of arrivals (time constant 5 s)")
    arrived = arrived_counter(config)
    exact = {
        dev: stats.get(dev, {}).get(arrived) == published[dev] * per_reading(config)
        for dev in devices
    }
    summary = {
        "run-id": run_id,
        "devices": {
            dev: {
                "target-rate": config.rates[i],
                "published": published[dev],
                "exactly-once": exact[dev],
                "ingest-exit-code": ingest_rc[dev],
                **stats.get(dev, {}),
            }
            for i, dev in enumerate(devices)
        },
        "duration-s": config.duration,
        "wall-s": round(elapsed, 2),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    ok = all(exact.values()) and all(rc == 0 for rc in ingest_rc.values())
    verdict = "[green]every published sample was received exactly once[/green]"
    if not ok:
        verdict = f"[red]mismatch[/red]: exactly-once {exact}, ingest exit codes {ingest_rc}"
    console.print(f"{verdict}; clean shutdown of all processes. Summary: {run_dir}/summary.json")
    return ok


def run_demo(config: DemoConfig, console: Console) -> bool:
    """``fedstream demo``: streams in, federated training through Flower's deployment engine.

    Starts a broker, per device a publisher, an ingest daemon and a SuperNode (with its
    slowdown), a SuperLink, then ``flwr run``; shows live progress; writes
    ``<out>/run-<time>/`` with ``metrics.jsonl``, ``report.png``, ``summary.json`` and logs.
    Returns True when the run finished all its rounds.
    """
    if config.stream_only:
        return run_stream_demo(config, console)
    assert config.rates is not None and config.slowdowns is not None
    if not (APP_DIR / "pyproject.toml").exists():
        raise FlowerError(f"no Flower app (pyproject.toml) at {APP_DIR}: run from a checkout")
    run_id = datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")
    run_dir = (config.out / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    devices = device_ids(config.devices)
    paths = {dev: run_dir / "buffers" / f"{dev}.sqlite" for dev in devices}
    start = time.monotonic()
    secrets = make_run_secrets(run_dir / "secrets", devices) if config.secure else None
    shards = write_shards(config, run_dir)
    with (
        demo_broker(config, console, secrets) as streams,
        agent_sockets(config.agent) as agent_dir,
        ProcessGroup() as group,
    ):
        start_ingest(group, config, streams, paths, run_dir)
        for i, dev in enumerate(devices):  # streaming until training ends
            start_publisher(group, config, streams, i, dev, run_dir, DEMO_PUBLISH_FOREVER_S)
        # Only a SuperLink that is to be killed and started again needs its state on disk.
        durable = config.kill_aggregator is not None
        flower = FlowerDeployment(group, run_dir / "flwr", secrets=secrets, durable=durable)
        node_configs = _start_flower(flower, config, paths, secrets, console, agent_dir)
        settings = _run_settings(config, run_dir)
        flwr_run = flower.submit(APP_DIR, settings.to_run_config())
        console.print(f"flwr run {flwr_run} submitted; training {settings.num_rounds} rounds")
        status, resumed = follow_run(
            flower, flwr_run, config, run_dir, console, node_configs, streams
        )
    wall = time.monotonic() - start
    records = read_metrics(run_dir / "metrics.jsonl")
    ended = _Ended(status, [flwr_run, *resumed], records, wall)
    return _report_training(config, settings, ended, shards, run_dir, console)


def _start_flower(
    flower: FlowerDeployment,
    config: DemoConfig,
    paths: dict[str, Path],
    secrets: RunSecrets | None,
    console: Console,
    agent_dir: Path | None = None,
) -> dict[str, NodeConfig]:
    """Start the SuperLink, one agent per device (with an ``agent_dir`` for their sockets)
    and one SuperNode per device (registered ones only with ``--secure``); return the
    SuperNodes' node configs once every one has joined."""
    assert config.slowdowns is not None
    flower.start_superlink()
    if secrets is not None:  # only these SuperNodes may join
        for dev in paths:
            flower.register_supernode(secrets.node_public_key(dev))
    node_configs = {
        dev: NodeConfig(
            dev,
            str(path),
            slowdown=config.slowdowns[i],
            threads=1,
            inject=config.inject,
        )
        for i, (dev, path) in enumerate(paths.items())
    }

    def node_config(dev: str, agent: str) -> dict[str, Any]:
        node_configs[dev] = replace(node_configs[dev], agent=agent)
        return node_configs[dev].to_node_config()

    taking = start_devices(flower, paths, node_config, agent_dir, take_tasks=config.agent_tasks)
    if taking:
        console.print(
            "[bold]device agents[/bold]: one `fedstream agent` per device holds torch and the "
            "model and takes its SuperNode's tasks itself: no process per message "
            "(--no-agent: Flower's way, a ClientApp process per message)"
        )
    elif agent_dir is not None:
        console.print(
            "[bold]device agents[/bold]: one `fedstream agent` per device holds torch and the "
            "model; each message's ClientApp hands over to it (--no-agent: it trains itself)"
        )
    console.print(
        f"[bold]{config.devices} devices[/bold] (slowdowns {config.slowdowns}, "
        f"streams {config.rates} {'readings' if config.series is not None else 'samples'}/s"
        f" of {what_streams(config)}): SuperLink on "
        f"127.0.0.1:{flower.port}" + (" (TLS, registered SuperNodes only)" if secrets else "")
    )
    flower.wait_nodes(config.devices)
    return node_configs


@dataclass(frozen=True)
class _Ended:
    """How a demo's training run ended: its last status, the runs submitted (more than one
    when the aggregator was killed and the run resumed), its rounds and its wall time."""

    status: dict[str, Any]
    runs: list[str]
    records: list[RoundRecord]
    wall_s: float


def _report_training(
    config: DemoConfig,
    settings: RunSettings,
    ended: _Ended,
    shards: dict[str, int],
    run_dir: Path,
    console: Console,
) -> bool:
    """Write ``summary.json`` and ``report.png`` of the run and say how it ended; True when
    it finished all its rounds."""
    every, status = ended.records, ended.status
    records = rounds_only(every)  # the timing probe's record counts in time, not as a round
    passes = source_passes(records, shards)
    diverged = run_diverged(records, settings)
    ok = status.get("status") == "finished:completed" and len(records) == settings.num_rounds
    export = final_export(settings) if ok else None
    serve = infer_command(config, settings) if export is not None else None
    summary = {
        **summarize(every, ended.wall_s),
        "run_id": ended.runs[-1],
        "runs": ended.runs,  # more than one when the aggregator was killed and the run resumed
        "status": status.get("status"),
        "diverged": diverged,  # the run ended because training diverged (max-diverged-rounds)
        "controller": settings.controller,
        "mode": settings.mode,
        "slowdowns": config.slowdowns,
        "rates": config.rates,
        "compress": settings.compress,
        "labels": config.labels,
        "dirichlet": config.dirichlet,
        "inject_alpha": settings.inject_alpha,
        "inject_beta": settings.inject_beta,
        "proximal_mu": settings.proximal_mu,
        "secure": config.secure,
        "source": str(config.source) if config.source else "synthetic",
        "partition": config.partition or ("natural" if config.partition_by else None),
        "partition_by": config.partition_by,
        "partition_groups": dict(zip(device_ids(config.devices), config.groups, strict=False)),
        "test": str(config.test) if config.test else None,
        "run_config": settings.to_run_config(),
        "source_passes": passes,
        "export": export,
        "infer_command": serve,
        "note": (
            "virtual_s: the timing probe's compute (probe_virtual_s) and, per round, the "
            "slowest device's compute + wait + upload"
        ),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if records:
        write_report(records, run_dir / "report.png", f"fedstream demo: {settings.controller}")
        console.print(progress_table(records, settings.num_rounds, "final"))
    if passes and max(passes.values()) > 1:
        console.print(
            f"the recording was replayed up to {max(passes.values()):.1f} times over: past the "
            "first pass, prequential scores include samples the model already trained on "
            "(the test set's score does not)"
        )
    _print_outcome(ok, diverged, ended, settings, summary, run_dir, console)
    return ok


def _print_outcome(
    ok: bool,
    diverged: bool,
    ended: _Ended,
    settings: RunSettings,
    summary: dict[str, Any],
    run_dir: Path,
    console: Console,
) -> None:
    """The demo's last lines: its result and where the report and the model are, or why the
    run diverged or did not finish, and where its logs are."""
    records = rounds_only(ended.records)
    logs = f"Logs: {run_dir}/logs, {run_dir}/flwr/logs, {run_dir}/serverapp.log"
    if ok:
        last = records[-1]
        test = (
            "" if math.isnan(last.test_accuracy) else f", {last.test_accuracy:.3f} on the test set"
        )
        console.print(
            f"[green]finished[/green]: {len(records)} rounds, {last.metric} {last.accuracy:.3f} "
            f"(prequential, on the devices){test}, {ended.wall_s:.0f} s wall. Report: "
            f"{run_dir}/report.png, {run_dir}/summary.json, {run_dir}/metrics.jsonl"
        )
        console.print(breakdown_line(summary["breakdown"]))
        export = summary["export"]
        if export is not None:
            console.print(
                f"the final model is version {export['version']} in {export['dir']}; serve it "
                f"on a device's stream with: {summary['infer_command']}",
                soft_wrap=True,
            )
    elif diverged:
        console.print(
            f"[red]the run diverged[/red] ({len(records)} of {settings.num_rounds} rounds): "
            f"{divergence_line(records, settings)}. {logs}"
        )
    else:
        status = ended.status
        why = status.get("status-details") or status.get("status") or "no status"
        console.print(
            f"[red]the run did not finish[/red] ({len(records)} of {settings.num_rounds} rounds): "
            f"{why}. {logs}"
        )


def _run_settings(config: DemoConfig, run_dir: Path) -> RunSettings:
    """The settings the demo submits: the checked ones, writing into ``run_dir`` (metrics,
    checkpoint, the final model in :data:`~deploy.constants.DEMO_MODELS` unless the run
    config names an ``export-dir``; then exported only at the end unless it sets
    ``export-every``), scored on a series' test stretch when one was given."""
    settings = replace(
        config.settings, out_dir=str(run_dir), checkpoint_dir=str(run_dir / "checkpoint")
    )
    if not settings.export_dir:
        every = settings.export_every if kebab("export_every") in config.run_config else 0
        settings = replace(settings, export_dir=str(run_dir / DEMO_MODELS), export_every=every)
    if config.test_windows is not None:  # a series' test stretch, cut into windows
        settings = replace(settings, eval_data=str(run_dir / "data" / "test.npz"))
    return settings
