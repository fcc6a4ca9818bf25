"""Commands of the operator: fleet, sensors, serve, stop, resume, models, report, app,
run-config."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console

from deploy.cli.common import console, fail, parse_run_config, require, setup_logging
from deploy.cli.options import (
    DEFAULT_BROKER_URL,
    NO_CREDENTIALS,
    PORT,
    POSITIVE,
    BrokerOption,
    ConnectionOption,
    ConnectTimeoutOption,
    Credentials,
    MetricsListenOption,
    VerboseOption,
    broker_options,
    with_credentials,
)
from deploy.constants import DISCOVERY_MODES, FLEET_PLAIN_WIDTH, RESUME_WAIT_S

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "fleet",
    "models",
    "report",
    "resume",
    "run_config_keys",
    "sensors",
    "serve",
    "stop",
    "write_app_dir",
]


@with_credentials
def fleet(
    broker: BrokerOption = DEFAULT_BROKER_URL,
    json_out: Annotated[
        bool, typer.Option("--json", help="JSON instead of a table (with --watch: one line each).")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep the view current until Ctrl+C or SIGTERM.")
    ] = False,
    interval: Annotated[
        float, typer.Option(help="Seconds between refreshes with --watch.", min=0.1)
    ] = 2.0,
    prometheus_port: Annotated[
        int | None,
        typer.Option(
            "--prometheus-port",
            help="Serve every device's status as Prometheus metrics on this port (/metrics) "
            "until Ctrl+C or SIGTERM.",
            click_type=PORT,
        ),
    ] = None,
    metrics_listen: MetricsListenOption = "0.0.0.0",
    credentials: Credentials = NO_CREDENTIALS,
    connect_timeout: ConnectTimeoutOption = 10.0,
    verbose: VerboseOption = False,
) -> None:
    """Every device's retained status in one table: online, stream rate, fill, dropped,
    refused by reason, last seen, drift."""
    import time

    from rich.live import Live

    from deploy.fleet_status import FleetView, fleet_rows
    from edge_client.runtime.signals import connected_or_raise, set_on_signals
    from edge_client.runtime.status_metrics import serve_statuses

    setup_logging(verbose)
    try:
        url = broker_options(broker, credentials, connect_timeout)
        view = FleetView(url)
    except ValueError as err:
        raise fail(str(err)) from err
    with view:
        try:
            connected_or_raise(
                view.wait_connected, view.connection, url, connect_timeout, view.stop
            )
        except ConnectionError as err:
            raise fail(str(err), code=1) from err
        view.wait_settled()
        if prometheus_port is not None:
            try:
                serve_statuses(prometheus_port, view.snapshot, metrics_listen)
            except OSError as err:
                raise fail(str(err), code=1) from err
            console.print(f"fleet metrics on http://{metrics_listen}:{prometheus_port}/metrics")
        if not (watch or prometheus_port is not None):
            _print_fleet(fleet_rows(view.snapshot(), time.time()), json_out, str(url))
            return
        with set_on_signals() as stop:
            if not watch:
                stop.wait()
            elif json_out:
                while not stop.is_set():
                    print(json.dumps(fleet_rows(view.snapshot(), time.time())), flush=True)
                    stop.wait(interval)
            else:
                with Live(
                    _fleet_table([], str(url)), console=Console(), auto_refresh=False
                ) as live:
                    while not stop.is_set():
                        rows = fleet_rows(view.snapshot(), time.time())
                        live.update(_fleet_table(rows, str(url)), refresh=True)
                        stop.wait(interval)


def _print_fleet(rows: list[dict[str, Any]], json_out: bool, broker: str) -> None:
    if json_out:
        print(json.dumps(rows))
        return
    if not rows:
        console.print(f"no device has published a status on {broker} yet")
        return
    # Off a terminal (a pipe, a log) rich would fit the table to 80 columns and cut the
    # headers: print it whole there.
    Console(width=None if sys.stdout.isatty() else FLEET_PLAIN_WIDTH).print(
        _fleet_table(rows, broker)
    )


def _fleet_table(rows: list[dict[str, Any]], broker: str) -> Table:
    """``fedstream fleet``'s table of :func:`deploy.fleet_status.fleet_rows` (fill as a share of the
    buffer's capacity)."""
    from rich import box
    from rich.table import Table

    def num(value: Any, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    table = Table(title=f"fleet on {broker}", box=box.SIMPLE_HEAD)
    columns = ("device", "online", "rate/s", "fill", "dropped", "refused", "missing", "seen")
    for column in (*columns, "drift", "sensors"):  # a header is never cut: its own width
        table.add_column(
            column,
            justify="left" if column == "device" else "right",
            min_width=len(column),
            no_wrap=True,
        )
    table.add_column("error")
    for row in rows:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(row["refused-by-reason"].items()))
        fill = num(row["fill"])
        if row["capacity"] and row["fill"] is not None:
            fill = f"{row['fill'] / row['capacity']:.0%}"
        table.add_row(
            row["device"],
            "[green]yes[/green]" if row["online"] else "[red]no[/red]",
            num(row["rate"], "{:.1f}"),
            fill,
            num(row["dropped"]),
            num(row["refused"]) + (f" ({reasons})" if reasons else ""),
            _missing(row),
            num(row["last-seen-s"], "{:.0f}s ago"),
            num(row["drift"]),
            _sensors(row["sensors-offline"]),
            row["error"] or "",
        )
    return table


def _sensors(offline: list[str] | None) -> str:
    """The fleet table's ``sensors`` cell: those away, in red; ``-`` where none is followed."""
    if offline is None:
        return "-"
    return f"[red]{len(offline)} off: {', '.join(offline)}[/red]" if offline else "all on"


def _missing(row: dict[str, Any]) -> str:
    """The fleet table's ``missing`` cell: messages and readings that never arrived, in red
    where any did."""
    parts = [
        f"{row[key]} {unit}"
        for key, unit in (("messages-missing", "msgs"), ("readings-missing", "readings"))
        if row[key]
    ]
    if parts:
        return f"[red]{', '.join(parts)}[/red]"
    known = row["messages-missing"] is not None or row["readings-missing"] is not None
    return "0" if known else "-"


@with_credentials
def sensors(
    broker: BrokerOption = DEFAULT_BROKER_URL,
    discovery: Annotated[
        str,
        typer.Option(
            "--discovery",
            help="What to look for: homeassistant (its discovery configs), sparkplug "
            "(Sparkplug B births while listening), sample (every topic that carries a "
            "message, by its payload) or all.",
            click_type=click.Choice(DISCOVERY_MODES),
        ),
    ] = "all",
    seconds: Annotated[
        float,
        typer.Option("--seconds", help="How long to listen.", click_type=POSITIVE),
    ] = 5.0,
    select: Annotated[
        list[str] | None,
        typer.Option(
            "--select",
            help="Read only the sensors whose name, topic or device matches this shell "
            "pattern (repeatable), e.g. 'kitchen*'; default: all.",
        ),
    ] = None,
    device_id: Annotated[
        str, typer.Option("--device-id", help="The device id the printed commands ingest as.")
    ] = "sensors",
    buffer: Annotated[
        str, typer.Option("--buffer", help="The buffer file the printed commands write.")
    ] = "sensors.sqlite",
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object: the sensors and the commands.")
    ] = False,
    credentials: Credentials = NO_CREDENTIALS,
    connect_timeout: ConnectTimeoutOption = 10.0,
    verbose: VerboseOption = False,
) -> None:
    """List the sensors a broker carries (Home Assistant discovery, Sparkplug B births,
    sampled topics) and print the fedstream ingest command lines that read them."""
    import time

    from deploy.sensor_discovery import (
        BrokerListener,
        discover,
        filters_of,
        ingest_commands,
    )
    from deploy.sensor_discovery import select as pick
    from edge_client.runtime.signals import connected_or_raise

    setup_logging(verbose)
    try:
        url = broker_options(broker, credentials, connect_timeout)
        listener = BrokerListener(url, filters_of(discovery))
    except ValueError as err:
        raise fail(str(err)) from err
    with listener:
        try:
            connected_or_raise(
                listener.wait_connected,
                listener.connection,
                url,
                connect_timeout,
                listener.stop,
            )
        except ConnectionError as err:
            raise fail(str(err), code=1) from err
        if not json_out:
            console.print(f"listening to {broker} for {seconds:g} s ...")
        time.sleep(seconds)
        seen, births = listener.snapshot()
    found = discover(seen, births, seconds, discovery)
    chosen = pick(found, select or [])
    commands = ingest_commands(chosen, broker, device_id, buffer)
    if json_out:
        print(
            json.dumps(
                {
                    "sensors": [s.as_json() for s in found],
                    "commands": [c.argv for c in commands],
                }
            )
        )
        return
    _print_sensors(found)
    if not commands:
        console.print("no sensor to read" + (" matches --select" if select else ""))
    for command in commands:
        console.print(f"\n# {len(command.sensors)} sensor(s), {command.sensors[0].kind}:")
        print(shlex.join(command.argv))


def _print_sensors(found: list[Any]) -> None:
    """``fedstream sensors``' table."""
    from rich.table import Table

    table = Table(title=f"{len(found)} sensor(s)")
    for column in ("name", "topic", "kind", "field", "unit", "device", "rate/s", "found by"):
        table.add_column(column)
    for s in found:
        table.add_row(
            s.name,
            s.topic,
            s.kind,
            s.field or "-",
            s.unit or "-",
            s.device or "-",
            "-" if s.rate is None else f"{s.rate:g}",
            s.source + (f" ({s.note})" if s.note else ""),
        )
    Console().print(table)


def models(
    directory: Annotated[Path, typer.Argument(help="A model directory (export-dir, model-dir).")],
    json_out: Annotated[bool, typer.Option("--json", help="One JSON list of manifests.")] = False,
) -> None:
    """List the versions of a model directory, oldest first."""
    from rich.table import Table

    from edge_client.task.manifest import SAMPLE_SHAPE
    from edge_client.wire.artifact import list_versions

    if not directory.is_dir():
        raise fail(f"{directory}: not a directory")
    versions = list_versions(directory)
    if json_out:
        print(json.dumps([{"path": str(v.path), **v.manifest} for v in versions], indent=1))
        return
    if not versions:
        console.print(f"{directory}: no model versions")
        return
    table = Table(title=str(directory))
    for column in ("version", "task", "output", "sample shape", "prequential", "format", "sha256"):
        table.add_column(column)
    for v in versions:
        m = v.manifest
        metric = str(m.get("metric", ""))
        scores = m.get("prequential") or {}
        score = scores.get(metric)
        table.add_row(
            str(v.version),
            str(m.get("task-name", "")),
            str(m.get("output", "")),
            "x".join(str(d) for d in m.get(SAMPLE_SHAPE, [])),
            "-" if score is None else f"{metric} {score:.4g}",
            str(m.get("program-format", "")),
            str(m.get("content-hash", ""))[:12],
        )
    Console().print(table)


def stop(
    directory: Annotated[Path, typer.Argument(help="The run's checkpoint-dir or out-dir.")],
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            help="Wait up to this many seconds for the run to take the request (0: do not "
            "wait); exit 1 if it has not.",
            min=0.0,
        ),
    ] = 0.0,
) -> None:
    """Ask a run to stop after its current round: it checkpoints, exports, and ends as
    completed; `fedstream resume` continues it. Run it as a user who may write the folder
    (the run's: the SuperLink unit's user)."""
    from aggregator.checkpoint import SERVER_ROUND, read_state
    from aggregator.stopping import request_stop, wait_taken

    if not directory.is_dir():
        raise fail(f"{directory}: no such folder (give the run's checkpoint-dir or out-dir)")
    try:
        path = request_stop(directory)
    except PermissionError as err:
        raise fail(
            f"cannot write {err.filename or directory}: "
            f"{err.strerror}. Run it as the folder's owner: sudo -u {directory.owner()} "
            f"fedstream stop {directory}"
        ) from err
    console.print(f"wrote {path}: the run stops after its current round", soft_wrap=True)
    if not wait:
        return
    if not wait_taken(path, wait):
        raise fail(
            f"no run took {path} within {wait:.0f} s: is {directory} a running run's "
            "checkpoint-dir or out-dir? (the file stays until one takes it; a run removes one "
            "left from before it started)",
            code=1,
        )
    with contextlib.suppress(OSError, ValueError):
        state = read_state(directory)
        if state is not None:
            console.print(
                f"the run stopped after round {state[SERVER_ROUND]}: `fedstream resume "
                f"{directory} --connection CONNECTION --app APP` continues it (CONNECTION: "
                "the SuperLink connection you ran it with, a [superlink.NAME] of "
                "$FLWR_HOME/config.toml; APP: the app's folder, /opt/fedstream/app from "
                "deploy/install.sh)",
                soft_wrap=True,
            )
            return
    console.print("the run stopped after its current round")


def report(
    run: Annotated[
        Path,
        typer.Argument(
            help="A run's out-dir (holding metrics.jsonl; a run Flower started keeps it in "
            "$FEDSTREAM_HOME/runs/<run-id>, ~/.fedstream by default) or a metrics.jsonl file."
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="Where summary.json and report.png go (default: the run's).")
    ] = None,
) -> None:
    """Draw the plots and write the summary of any run from its metrics.jsonl (rotated files
    included): a deployed run's, a simulation's, the demo's."""
    from aggregator.round_log import read_rotated, rounds_only
    from deploy.report import in_round_order, summarize, training_time, write_report

    require("fedstream report", ("matplotlib",))

    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.exists():
        raise fail(f"{path}: no metrics.jsonl (was out-dir = 'none' in the run config?)")
    try:
        records = read_rotated(path)
    except ValueError as err:
        raise fail(str(err)) from err
    if not rounds_only(records):
        raise fail(f"{path}: no rounds yet")
    where = out or path.parent
    where.mkdir(parents=True, exist_ok=True)
    ordered = in_round_order(records)  # a resumed run's rounds, by round
    summary = summarize(records, training_time(ordered)[-1])
    (where / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(records, where / "report.png", f"fedstream run: {path.parent.name}")
    last = ordered[-1]
    private = (
        f", epsilon {last.dp_epsilon_spent:.3g} spent" if last.dp_epsilon_spent is not None else ""
    )
    scores = [
        f"{last.metric} {_score(summary['final_accuracy'])} prequential",
        "no eval-data"
        if summary["test_accuracy"] is None
        else f"{_score(summary['test_accuracy'])} on eval-data",
    ]
    console.print(
        f"{summary['rounds']} rounds (to round {last.round}), {', '.join(scores)}{private}; "
        f"wrote {where / 'summary.json'} "
        f"and {where / 'report.png'}",
        soft_wrap=True,
    )


def _score(value: float | None) -> str:
    """A score as the report's line shows it (``n/a`` for none)."""
    return "n/a" if value is None else f"{value:.3f}"


def write_app_dir(
    directory: Annotated[Path, typer.Argument(help="Folder to write the app's pyproject.toml to.")],
) -> None:
    """Write fedstream's own Flower app (ServerApp, ClientApp, every run-config key) to a
    folder, for `flwr run DIR <connection>` and `fedstream resume --app DIR` without a checkout.
    """
    from deploy.flower import write_app

    try:
        path = write_app(directory)
    except OSError as err:
        raise fail(f"cannot write the app to {directory}: {err}") from err
    console.print(f"wrote {path}: flwr run {directory} <connection> submits it", soft_wrap=True)


def run_config_keys(
    toml: Annotated[
        bool,
        typer.Option("--toml", help="Print the tool.flwr.app.config block of pyproject.toml."),
    ] = False,
) -> None:
    """List every run-config key: default, allowed values, what it does."""
    from rich.table import Table

    from edge_client.wire.run_config import knobs

    declared = knobs()
    if toml:
        from deploy.flower import config_toml

        print(config_toml(), end="")
        return
    table = Table(title="run config (flwr run --run-config 'key=value ...')")
    table.add_column("key", no_wrap=True)
    table.add_column("default", no_wrap=True)
    table.add_column("allowed")
    table.add_column("what it does")
    for key, knob in declared.items():
        table.add_row(key, json.dumps(knob["default"]), knob["allowed"], knob["help"])
    Console().print(table)


def _app_option(more: str = "") -> Any:
    """``--app`` of ``resume`` and ``serve``: the Flower app to submit."""
    return typer.Option(
        "--app",
        help="The Flower app (folder with pyproject.toml; default: the current directory, "
        "when it holds one)." + more,
    )


def resume(
    checkpoint_dir: Annotated[
        Path, typer.Argument(help="The run's checkpoint-dir (holds state.json).")
    ],
    connection: ConnectionOption = None,
    app_dir: Annotated[
        Path | None,
        _app_option(" deploy/install.sh writes fedstream's to /opt/fedstream/app."),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            help="Seconds to wait for the run that wrote the checkpoint to end (one whose "
            "aggregator died is marked failed within about a minute).",
            min=0.0,
        ),
    ] = RESUME_WAIT_S,
) -> None:
    """Continue a run after an aggregator crash, from its last checkpoint.

    Submits the run config stored in the checkpoint again with resume=true: same rounds,
    model and settings; the model, controller state and device map come from the checkpoint.
    Waits first for the run that wrote the checkpoint to end (after a crash Flower shows it
    running for about a minute).
    """
    from deploy.flower import FlowerError, resume_run

    try:
        run_id, last, total = resume_run(
            checkpoint_dir,
            app_dir,
            connection,
            wait_s=wait,
            on_wait=lambda line: console.print(line, soft_wrap=True),
        )
    except FlowerError as err:
        raise fail(str(err)) from err
    if total == 0:
        console.print(f"resumed a continuous run after round {last} as run {run_id}")
    elif last >= total:
        console.print(
            f"the checkpoint already holds all {total} rounds (run {run_id} ends at once)"
        )
    else:
        console.print(f"resumed after round {last} of {total} as run {run_id}")
    print(json.dumps({"run-id": run_id, "resumed-after": last, "num-rounds": total}))


def serve(
    checkpoint_dir: Annotated[
        Path,
        typer.Option(
            "--checkpoint-dir", help="The run's checkpoints: resumed from when there is one."
        ),
    ],
    run_config: Annotated[
        str | None,
        typer.Option(
            "--run-config",
            help="Run-config overrides of a new run, as flwr run takes them (num-rounds is 0).",
        ),
    ] = None,
    connection: ConnectionOption = None,
    app_dir: Annotated[Path | None, _app_option()] = None,
    verbose: VerboseOption = False,
) -> None:
    """Keep a continuous run (num-rounds = 0) going on a SuperLink until SIGTERM; then stop it
    after its current round and exit 0 (the aggregator's systemd unit runs this)."""
    from deploy.aggregator_service import serve as serve_run
    from deploy.flower import FlowerError, find_app

    setup_logging(verbose)
    try:
        settings = parse_run_config(run_config)
        code = serve_run(find_app(app_dir), checkpoint_dir, settings, connection)
    except (FlowerError, ValueError) as err:
        raise fail(str(err)) from err
    raise typer.Exit(code)
