"""The ``fedstream`` command line."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from deploy.bench import SCENARIOS
from deploy.constants import (
    DEFAULT_MQTT_PORT,
    DEMO_CAPACITY,
    DEMO_DEVICES,
    DEMO_DURATION_S,
    DEMO_SETTINGS,
)
from deploy.extras import DEMO_EXTRA, MissingExtraError, require_extra
from deploy.local import STOP_SIGNALS, Stopped, descendants, stop_on_signals
from edge_client.emulation.constants import DISTRIBUTIONS, PUBLISH_PROGRESS_S
from edge_client.runtime.constants import (
    COMMIT_INTERVAL_S,
    DEFAULT_CAPACITY,
    DEFAULT_LABEL_WAIT_S,
    DEFAULT_MAX_GAP_S,
    DEFAULT_MAX_SKEW_S,
    DEFAULT_POLICY,
    POLICIES,
    RATE_LOG_S,
    STATUS_INTERVAL_S,
)
from edge_client.runtime.drift_watch import DEFAULT_DELTA
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE, DIGITS_SHAPE
from edge_client.wire.constants import RATE_SETS
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import default

if TYPE_CHECKING:
    from rich.table import Table

    from edge_client.runtime.infer import InferenceDaemon
    from edge_client.runtime.ingest import IngestDaemon
    from edge_client.runtime.windowing import WindowSpec

__all__ = ["app", "main"]

app = typer.Typer(
    name="fedstream",
    help="Federated learning on live MQTT sensor streams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(stderr=True)


# Choices of options, from the vocabularies declared in the constants modules.
Policy = StrEnum("Policy", [(p, p) for p in POLICIES])  # type: ignore[misc]
Distribution = StrEnum("Distribution", [(d, d) for d in DISTRIBUTIONS])  # type: ignore[misc]
RateSet = Enum("RateSet", {name: name for name in RATE_SETS}, type=str)  # type: ignore[misc]
_DEFAULT_POLICY = Policy(DEFAULT_POLICY)
_READINGS = "Per-reading JSON (--window)"


# Options several commands share.
UsernameOption = Annotated[
    str | None, typer.Option(help="Broker username (the device id under the ACL).")
]
PasswordOption = Annotated[
    str | None,
    typer.Option(
        envvar="FEDSTREAM_MQTT_PASSWORD", help="Broker password (better: the environment variable)."
    ),
]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")]
CafileOption = Annotated[str | None, typer.Option(help="CA bundle (enables TLS).")]
CertfileOption = Annotated[
    str | None,
    typer.Option(
        help="This client's certificate (PEM; enables TLS), for brokers that require one "
        "(Mosquitto's require_certificate, AWS IoT)."
    ),
]
KeyfileOption = Annotated[
    str | None, typer.Option(help="The key of --certfile (PEM), if not in the same file.")
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port", help="Serve Prometheus metrics on this port (/metrics); default: off."
    ),
]
MetricsListenOption = Annotated[
    str, typer.Option("--metrics-listen", help="Address the metrics endpoint binds to.")
]

# Options ``ingest`` and ``infer`` share: per-reading JSON cut into windows.
TopicOption = Annotated[
    list[str] | None,
    typer.Option(
        "--topic",
        help="Subscribe to this topic instead of fedstream/v1/<id>/samples (repeatable; "
        "wildcards allowed). With --window: TOPIC=FIELDS names that topic's channels.",
        rich_help_panel=_READINGS,
    ),
]
FieldsOption = Annotated[
    str | None,
    typer.Option(
        help="Per-reading JSON: the channels' fields, e.g. ax,ay,az, imu.acc.x or acc[0:3].",
        rich_help_panel=_READINGS,
    ),
]
WindowOption = Annotated[
    int | None,
    typer.Option(
        help="Readings per sample (turns on per-reading JSON).", rich_help_panel=_READINGS
    ),
]
StrideOption = Annotated[
    int | None,
    typer.Option(
        help="Readings between sample starts (default: the window).", rich_help_panel=_READINGS
    ),
]
MaxGapOption = Annotated[
    float,
    typer.Option(
        "--max-gap",
        help="No sample spans a longer gap between readings (s).",
        rich_help_panel=_READINGS,
    ),
]
RateOption = Annotated[
    float | None,
    typer.Option(
        help="Resample onto this many readings/s (needed with several topics).",
        rich_help_panel=_READINGS,
    ),
]
MaxSkewOption = Annotated[
    float,
    typer.Option(
        "--max-skew",
        help="How far one topic may run behind another (s).",
        rich_help_panel=_READINGS,
    ),
]
TimeFieldOption = Annotated[
    str, typer.Option("--time-field", help="The timestamp's field.", rich_help_panel=_READINGS)
]
TimeUnitOption = Annotated[
    str,
    typer.Option(
        "--time-unit",
        help="s, ms, us or ns (ISO 8601 strings are read too).",
        rich_help_panel=_READINGS,
    ),
]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"fedstream {version('fedstream')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Federated learning on live MQTT sensor streams."""


def _run_help(name: str, text: str) -> str:
    """Help of a demo option that is a run-config key: what it does, its key and default."""
    return f"{text} ({kebab(name)}, default {default(name)})"


_DEFAULT_DISTRIBUTION = Distribution(DISTRIBUTIONS[0])


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise typer.BadParameter(f"shape must look like 6,32 or 6x32, got {text!r}") from None
    if not shape or min(shape) < 1:
        raise typer.BadParameter(f"shape dimensions must be >= 1, got {text!r}")
    return shape


def _window_spec(
    device_id: str,
    topic: list[str] | None,
    fields: str | None,
    window: int | None,
    stride: int | None,
    time_field: str,
    time_unit: str,
    max_gap: float,
    rate: float | None,
    max_skew: float,
    **labels: Any,
) -> WindowSpec | None:
    """The windowing of per-reading JSON that ``ingest`` and ``infer`` options describe
    (None without ``--window``).

    Raises
    ------
    ValueError
        If the options contradict each other.
    """
    from edge_client.runtime.windowing import WindowSpec
    from edge_client.wire import samples_topic

    if window is None:
        if fields:
            raise ValueError("per-reading JSON needs --window (readings per sample)")
        return None
    return WindowSpec.from_options(
        topics=topic or [samples_topic(device_id)],
        fields=fields,
        window=window,
        stride=stride or 0,
        time_field=time_field,
        time_unit=time_unit,
        max_gap=max_gap,
        rate=rate,
        max_skew=max_skew,
        **labels,
    )


def _run_daemon(daemon: IngestDaemon | InferenceDaemon) -> None:
    """Run a device daemon until SIGTERM; a broker never reached is a runtime failure."""
    try:
        daemon.run()
    except (ConnectionError, OSError) as err:  # OSError: its metrics port is taken
        raise _fail(str(err), code=1) from err


@contextlib.contextmanager
def _stoppable(what: str, *, normal_end: bool = False) -> Iterator[None]:
    """Run a command that starts processes so that SIGTERM, Ctrl-C or SIGHUP stops all of
    them (a second one kills them at once), says so, and exits with the signal's code (0
    where a signal is how ``what`` normally ends: ``normal_end``)."""
    try:
        with stop_on_signals(lambda line: console.print(f"[yellow]{escape(line)}[/yellow]")):
            yield
    except Stopped as stop:
        left = descendants(os.getpid())
        if left:
            pids = ", ".join(str(pid) for pid, _ in left)
            console.print(f"[red]{what} stopped by {stop}; still running: {pids}[/red]")
        else:
            console.print(f"[yellow]{what} stopped by {stop}; nothing it started is running[/]")
        raise typer.Exit(0 if normal_end else stop.exit_code) from None


def _require(purpose: str, modules: tuple[str, ...] = tuple(DEMO_EXTRA)) -> None:
    """Exit 1 with the install command if ``purpose`` needs an extra that is missing."""
    try:
        require_extra(purpose, modules)
    except MissingExtraError as err:
        raise _fail(str(err), code=1) from err


def _fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one line and return the exit to raise: 2 for a usage error
    (bad options or input), 1 for a failure at run time (a broker never reached)."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # [...] is text
    return typer.Exit(code)


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="MQTT port.")] = DEFAULT_MQTT_PORT,
    listen: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    verbose: VerboseOption = False,
) -> None:
    """Run the embedded MQTT broker (iotcore / rumqttd) in the foreground."""
    from deploy.brokers import run_embedded_broker

    _setup_logging(verbose)
    _require("fedstream broker", ("iotcore",))
    console.print(f"embedded MQTT broker on mqtt://{listen}:{port} (Ctrl+C stops it)")
    try:
        with _stoppable("the broker", normal_end=True):
            run_embedded_broker(port, listen)
    except OSError as err:
        raise _fail(f"cannot listen on {listen}:{port}: {err}") from err


@app.command()
def publish(
    device_id: Annotated[str, typer.Option("--device-id", help="Device the stream feeds.")],
    broker: Annotated[str, typer.Option(help="mqtt://HOST:PORT or mqtts://...")] = (
        "mqtt://127.0.0.1:1883"
    ),
    rate: Annotated[float | None, typer.Option(help="Samples per second.")] = None,
    rate_set: Annotated[
        RateSet | None, typer.Option("--rate-set", help="Draw the rate from a ScaDLES set.")
    ] = None,
    distribution: Annotated[
        Distribution, typer.Option(help="Arrival process.")
    ] = _DEFAULT_DISTRIBUTION,
    batch: Annotated[int, typer.Option(help="Samples per message.")] = 1,
    count: Annotated[
        int | None,
        typer.Option(
            help="Stop after this many samples (neither this nor --duration: run "
            "until SIGTERM or Ctrl+C, as a sensor does)."
        ),
    ] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    source: Annotated[
        str,
        typer.Option(
            help="'synthetic', 'digits' (8x8 frames, scikit-learn), or an .npz (x, y) or "
            ".csv (label,f1,...) file."
        ),
    ] = "synthetic",
    labels: Annotated[
        int | None,
        typer.Option(help="Pathological skew: K classes per device, picked by --seed and id."),
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="Only these classes, e.g. '0,3' (label skew).")
    ] = None,
    dirichlet: Annotated[
        float | None, typer.Option(help="Class mix drawn from Dirichlet(ALPHA).")
    ] = None,
    feature_shift: Annotated[
        float, typer.Option("--feature-shift", help="Per-device sensor gain/bias scale.")
    ] = 0.0,
    shape: Annotated[str, typer.Option(help="Synthetic/CSV sample shape.")] = "6,32",
    num_classes: Annotated[
        int,
        typer.Option(
            "--num-classes", help="Classes of the labels (the device's ingest --num-classes)."
        ),
    ] = DEFAULT_NUM_CLASSES,
    qos: Annotated[int, typer.Option(help="MQTT QoS.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed for rate, samples and arrivals.")] = 0,
    username: UsernameOption = None,
    password: PasswordOption = None,
    cafile: CafileOption = None,
    certfile: CertfileOption = None,
    keyfile: KeyfileOption = None,
    connect_timeout: Annotated[
        float, typer.Option("--connect-timeout", help="Give up if not connected by then (s).")
    ] = 30.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    progress_interval: Annotated[
        float,
        typer.Option(
            "--progress-interval", help="Seconds between progress lines on stderr; 0: none.", min=0
        ),
    ] = PUBLISH_PROGRESS_S,
    readings: Annotated[
        bool,
        typer.Option(
            "--readings",
            help="Publish the --source series (.csv with a header, or .npz) as per-reading "
            "JSON, one reading per message (--batch: a list of that many).",
        ),
    ] = False,
    topic: Annotated[
        str | None, typer.Option(help="Publish here instead of fedstream/v1/<id>/samples.")
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Publish a sensor stream at a rate; prints the achieved rate at the end."""
    from edge_client.emulation import (
        ArraySource,
        PublisherConfig,
        SampleSource,
        SeriesReadings,
        SyntheticSource,
        dataset_source,
        draw_rate,
        label_distribution,
        pick_classes,
        run_publisher,
    )
    from edge_client.runtime import BrokerURL, device_rng
    from edge_client.task import SensorTask, load_dataset, load_recording
    from edge_client.wire import validate_device_id

    _setup_logging(verbose)
    try:
        validate_device_id(device_id)
        url = BrokerURL.parse(broker)
        if (rate is None) == (rate_set is None):
            raise ValueError("give exactly one of --rate and --rate-set")
        if rate_set is not None:
            rate = draw_rate(rate_set.value, device_rng(seed, device_id, 1))
        assert rate is not None
        if labels is not None and classes is not None:
            raise ValueError("give --labels K or --classes LIST, not both")
        rng = device_rng(seed, device_id, 2)
        label_list = [int(k) for k in classes.split(",")] if classes else None
        if labels is not None:
            label_list = pick_classes(labels, num_classes, rng=device_rng(seed, device_id, 3))
        probs = label_distribution(num_classes, rng, label_list, dirichlet)
        src: SampleSource | SeriesReadings
        if readings:
            if source in ("synthetic", "digits") or label_list or dirichlet is not None:
                raise ValueError("--readings replays a series file: give --source FILE, no skew")
            src = SeriesReadings.from_file(source, rate)
        elif source == "synthetic":
            task = SensorTask(_parse_shape(shape), num_classes)
            src = SyntheticSource(task, rng, probs, feature_shift)
        elif source == "digits":  # 8x8 camera frames (ingest with --shape 8,8 --num-classes 10)
            digits = load_dataset("digits", DIGITS_SHAPE, num_classes)
            src = dataset_source(digits, rng, probs, feature_shift)
        else:
            declared = _parse_shape(shape)
            x, y = load_recording(source, declared)
            # Checked here, before anything is sent: the device's ingest daemon (--shape,
            # --num-classes) would acknowledge and then refuse every such sample.
            if x.shape[1:] != declared:
                raise ValueError(
                    f"{source}: samples of shape {tuple(x.shape[1:])}, but --shape is {declared}: "
                    "the device's ingest would refuse every one (give the shape it declares)"
                )
            if len(y) and int(y.max()) >= num_classes:
                raise ValueError(
                    f"{source}: labels up to {int(y.max())}, but --num-classes is {num_classes}: "
                    "the device's ingest would refuse those samples"
                )
            skewed = label_list is not None or dirichlet is not None
            src = ArraySource(x, y, rng, probs if skewed else None)
        config = PublisherConfig(
            broker=url,
            device_id=device_id,
            rate=rate,
            count=count,
            duration=duration,
            batch=batch,
            distribution=distribution.value,
            qos=qos,
            seed=seed,
            username=username,
            password=password,
            cafile=cafile,
            certfile=certfile,
            keyfile=keyfile,
            connect_timeout=connect_timeout,
            topic=topic,
        )
    except (ValueError, OSError) as err:
        raise _fail(str(err)) from err
    unit = "readings" if readings else "samples"
    console.print(
        f"publishing to {url} as {device_id}: {rate:.1f} {unit}/s, "
        f"{batch} per message, {distribution.value}"
    )
    stop = threading.Event()
    for sig in STOP_SIGNALS:  # stop cleanly: drain, report, exit 0
        signal.signal(sig, lambda *_: stop.set())

    def progress(sent: int, acknowledged: int, elapsed: float) -> None:
        of = f" of {count}" if count else ""
        share = sent / count if count else elapsed / duration if duration else None
        console.print(
            f"sent {sent}{of} {unit}{'' if share is None else f' ({share:.0%})'} in "
            f"{elapsed:.1f} s: {sent / elapsed:.1f} "
            f"{unit}/s; {acknowledged} messages acknowledged",
            soft_wrap=True,
        )

    try:
        report = run_publisher(
            config,
            src,
            stop=stop,
            on_progress=progress if progress_interval > 0 else None,
            progress_interval=progress_interval,
        )
    except (ConnectionError, ValueError) as err:  # ValueError: its TLS files
        raise _fail(str(err)) from err
    if json_out:
        print(json.dumps(report.as_dict()), flush=True)
    console.print(
        f"published {report.samples} samples in {report.messages} messages over "
        f"{report.elapsed_s:.1f} s: achieved {report.achieved_rate:.1f} samples/s "
        f"(target {report.target_rate:.1f}); {report.acknowledged} acknowledged"
    )


@app.command()
def ingest(
    device_id: Annotated[str, typer.Option("--device-id", help="This device's id.")],
    buffer: Annotated[Path, typer.Option(help="The SQLite buffer file.")],
    broker: Annotated[str, typer.Option(help="mqtt://HOST:PORT or mqtts://...")] = (
        "mqtt://127.0.0.1:1883"
    ),
    policy: Annotated[Policy, typer.Option(help="Overflow policy.")] = _DEFAULT_POLICY,
    capacity: Annotated[int, typer.Option(help="Maximum samples held.")] = DEFAULT_CAPACITY,
    capacity_bytes: Annotated[
        int | None, typer.Option("--capacity-bytes", help="Also cap the buffer in bytes.")
    ] = None,
    shape: Annotated[
        str | None,
        typer.Option(help="Declared sample shape (default 6,32; with --window: channels,window)."),
    ] = None,
    num_classes: Annotated[
        int | None,
        typer.Option(
            "--num-classes", help=f"Classes of integer labels (default {DEFAULT_NUM_CLASSES})."
        ),
    ] = None,
    status_interval: Annotated[
        float, typer.Option("--status-interval", help="Seconds between status messages.")
    ] = STATUS_INTERVAL_S,
    log_interval: Annotated[
        float,
        typer.Option("--log-interval", help="Seconds between the log's lines of what came in."),
    ] = RATE_LOG_S,
    commit_interval: Annotated[
        float,
        typer.Option(
            "--commit-interval",
            help="Longest seconds one SQLite transaction gathers messages: longer writes less "
            "per sample (SD cards) and loses nothing (messages are acknowledged once committed).",
        ),
    ] = COMMIT_INTERVAL_S,
    username: UsernameOption = None,
    password: PasswordOption = None,
    cafile: CafileOption = None,
    certfile: CertfileOption = None,
    keyfile: KeyfileOption = None,
    inject: Annotated[
        bool,
        typer.Option(
            "--inject",
            help="Opt in to data injection: keep others' shared samples, publish ours.",
        ),
    ] = False,
    topic: TopicOption = None,
    fields: FieldsOption = None,
    window: WindowOption = None,
    stride: StrideOption = None,
    max_gap: MaxGapOption = DEFAULT_MAX_GAP_S,
    rate: RateOption = None,
    max_skew: MaxSkewOption = DEFAULT_MAX_SKEW_S,
    time_field: TimeFieldOption = "ts",
    time_unit: TimeUnitOption = "s",
    label_field: Annotated[
        str | None,
        typer.Option(
            "--label-field",
            help="The label's field (on the first --topic, or on --label-topic); none: label-free.",
            rich_help_panel=_READINGS,
        ),
    ] = None,
    label_topic: Annotated[
        str | None,
        typer.Option(
            "--label-topic",
            help="Labels arrive on this topic, joined by timestamp.",
            rich_help_panel=_READINGS,
        ),
    ] = None,
    classes: Annotated[
        str | None,
        typer.Option(
            help="Class names of string labels, in index order: walk,run,sit.",
            rich_help_panel=_READINGS,
        ),
    ] = None,
    label_wait: Annotated[
        float,
        typer.Option(
            "--label-wait",
            help="Seconds of stream time a sample waits for its label.",
            rich_help_panel=_READINGS,
        ),
    ] = DEFAULT_LABEL_WAIT_S,
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            help="Exit 1 (with the reason) if the first connection has not succeeded after "
            "this many seconds; default: keep retrying.",
        ),
    ] = None,
    metrics_port: MetricsPortOption = None,
    metrics_listen: MetricsListenOption = "0.0.0.0",
    verbose: VerboseOption = False,
) -> None:
    """Run the ingest daemon: MQTT samples into the device's durable buffer.

    Sample frames by default; with --window, per-reading JSON cut into windows of readings.
    """
    from edge_client.runtime.buffer import BufferStoreError
    from edge_client.runtime.ingest import IngestConfig, IngestDaemon
    from edge_client.runtime.mqtt import BrokerURL

    _setup_logging(verbose)
    try:
        if window is None and (label_field or label_topic or classes):
            raise ValueError("per-reading JSON needs --window (readings per sample)")
        spec = _window_spec(
            device_id, topic, fields, window, stride, time_field, time_unit, max_gap, rate,
            max_skew, label_field=label_field, label_topic=label_topic, classes=classes,
            num_classes=num_classes or 0, label_wait=label_wait,
        )  # fmt: skip
        config = IngestConfig(
            broker=BrokerURL.parse(broker),
            device_id=device_id,
            buffer=buffer,
            policy=policy.value,
            capacity=capacity,
            capacity_bytes=capacity_bytes,
            shape=_parse_shape(shape) if shape else DEFAULT_SHAPE,  # checked against --window
            num_classes=num_classes or DEFAULT_NUM_CLASSES,
            username=username,
            password=password,
            cafile=cafile,
            certfile=certfile,
            keyfile=keyfile,
            status_interval=status_interval,
            log_interval=log_interval,
            commit_interval=commit_interval,
            inject=inject,
            topics=tuple(topic or ()) if spec is None else (),
            windowing=spec,
            connect_timeout=connect_timeout,
            metrics_port=metrics_port,
            metrics_listen=metrics_listen,
        )
        daemon = IngestDaemon(config)
    except (ValueError, BufferStoreError, OSError) as err:
        raise _fail(str(err)) from err
    _run_daemon(daemon)


@app.command()
def status(
    buffer: Annotated[Path, typer.Option(help="The SQLite buffer file.")],
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show a buffer's counters, fill and stream rate."""
    from rich.table import Table

    from edge_client.runtime.buffer import BufferStore, BufferStoreError

    try:
        with BufferStore(buffer) as store:
            stats = store.stats()
    except BufferStoreError as err:
        raise _fail(str(err)) from err
    if json_out:
        print(json.dumps(stats))
        return
    table = Table(title=str(buffer), show_header=False)
    for key, value in stats.items():
        table.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    Console().print(table)


@app.command()
def fleet(
    broker: Annotated[str, typer.Option(help="mqtt://HOST:PORT or mqtts://...")] = (
        "mqtt://127.0.0.1:1883"
    ),
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
        ),
    ] = None,
    metrics_listen: MetricsListenOption = "0.0.0.0",
    username: UsernameOption = None,
    password: PasswordOption = None,
    cafile: CafileOption = None,
    certfile: CertfileOption = None,
    keyfile: KeyfileOption = None,
    connect_timeout: Annotated[
        float,
        typer.Option(
            "--connect-timeout", help="Exit 1 (with the reason) if not connected by then.", min=0.1
        ),
    ] = 10.0,
    verbose: VerboseOption = False,
) -> None:
    """Every device's retained status in one table: online, stream rate, fill, dropped,
    refused by reason, last seen, drift."""
    import time

    from rich.live import Live

    from deploy.fleet_status import FleetView, fleet_rows
    from edge_client.runtime.mqtt import BrokerURL
    from edge_client.runtime.signals import connected_or_raise
    from edge_client.runtime.status_metrics import serve_statuses

    _setup_logging(verbose)
    try:
        url = BrokerURL.parse(broker)
    except ValueError as err:
        raise _fail(str(err)) from err
    try:
        view = FleetView(url, username, password, cafile, certfile, keyfile)
    except ValueError as err:
        raise _fail(str(err)) from err
    with view:
        try:
            connected_or_raise(
                view.wait_connected, view.connection, url, connect_timeout, view.stop
            )
        except ConnectionError as err:
            raise _fail(str(err), code=1) from err
        view.wait_settled()
        if prometheus_port is not None:
            try:
                serve_statuses(prometheus_port, view.snapshot, metrics_listen)
            except OSError as err:
                raise _fail(str(err), code=1) from err
            console.print(f"fleet metrics on http://{metrics_listen}:{prometheus_port}/metrics")
        if not (watch or prometheus_port is not None):
            _print_fleet(fleet_rows(view.snapshot(), time.time()), json_out, str(url))
            return
        stop = threading.Event()
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: stop.set())
        if not watch:
            stop.wait()
        elif json_out:
            while not stop.is_set():
                print(json.dumps(fleet_rows(view.snapshot(), time.time())), flush=True)
                stop.wait(interval)
        else:
            with Live(_fleet_table([], str(url)), console=Console(), auto_refresh=False) as live:
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
    Console().print(_fleet_table(rows, broker))


def _fleet_table(rows: list[dict[str, Any]], broker: str) -> Table:
    """``fedstream fleet``'s table of :func:`deploy.fleet_status.fleet_rows` (fill as a share of the
    buffer's capacity)."""
    from rich import box
    from rich.table import Table

    def num(value: Any, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    table = Table(title=f"fleet on {broker}", box=box.SIMPLE_HEAD)
    for column in ("device", "online", "rate/s", "fill", "dropped", "refused", "seen", "drift"):
        table.add_column(column, justify="left" if column == "device" else "right")
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
            num(row["last-seen-s"], "{:.0f}s ago"),
            num(row["drift"]),
            row["error"] or "",
        )
    return table


@app.command()
def infer(
    device_id: Annotated[str, typer.Option("--device-id", help="This device's id.")],
    model: Annotated[
        Path,
        typer.Option(
            help="Model directory to follow: the device's model-dir (node config) or an "
            "export-dir; the newest version is run, newer ones picked up as they appear."
        ),
    ],
    broker: Annotated[str, typer.Option(help="mqtt://HOST:PORT or mqtts://...")] = (
        "mqtt://127.0.0.1:1883"
    ),
    buffer: Annotated[
        Path | None,
        typer.Option(
            help="The device's buffer file: its preprocessing statistics, and where the drift "
            "watcher's state goes (then in the ingest status and the ClientApp's replies)."
        ),
    ] = None,
    drift: Annotated[
        str, typer.Option(help="Drift watcher on the prequential error: adwin or none.")
    ] = "adwin",
    drift_delta: Annotated[
        float, typer.Option("--drift-delta", help="ADWIN's confidence (smaller: surer, later).")
    ] = DEFAULT_DELTA,
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            help="Exit 1 (with the reason) if the first connection has not succeeded after "
            "this many seconds; default: keep retrying.",
        ),
    ] = None,
    username: UsernameOption = None,
    password: PasswordOption = None,
    cafile: CafileOption = None,
    certfile: CertfileOption = None,
    keyfile: KeyfileOption = None,
    topic: TopicOption = None,
    fields: FieldsOption = None,
    window: WindowOption = None,
    stride: StrideOption = None,
    max_gap: MaxGapOption = DEFAULT_MAX_GAP_S,
    rate: RateOption = None,
    max_skew: MaxSkewOption = DEFAULT_MAX_SKEW_S,
    time_field: TimeFieldOption = "ts",
    time_unit: TimeUnitOption = "s",
    verbose: VerboseOption = False,
) -> None:
    """Run the newest model on every sample of the device's stream; publish predictions to
    fedstream/v1/<device-id>/predictions."""
    from edge_client.runtime.infer import InferConfig, InferenceDaemon
    from edge_client.runtime.mqtt import BrokerURL

    _setup_logging(verbose)
    try:
        spec = _window_spec(
            device_id, topic, fields, window, stride, time_field, time_unit, max_gap, rate, max_skew
        )
        daemon = InferenceDaemon(
            InferConfig(
                broker=BrokerURL.parse(broker),
                device_id=device_id,
                model_dir=model,
                buffer=buffer,
                username=username,
                password=password,
                cafile=cafile,
                certfile=certfile,
                keyfile=keyfile,
                topics=tuple(topic or ()) if spec is None else (),
                windowing=spec,
                drift=drift,
                drift_delta=drift_delta,
                connect_timeout=connect_timeout,
            )
        )
    except (ValueError, OSError) as err:
        raise _fail(str(err)) from err
    _run_daemon(daemon)


@app.command()
def models(
    directory: Annotated[Path, typer.Argument(help="A model directory (export-dir, model-dir).")],
    json_out: Annotated[bool, typer.Option("--json", help="One JSON list of manifests.")] = False,
) -> None:
    """List the versions of a model directory, oldest first."""
    from rich.table import Table

    from edge_client.task.manifest import SAMPLE_SHAPE
    from edge_client.wire.artifact import list_versions

    if not directory.is_dir():
        raise _fail(f"{directory}: not a directory")
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


@app.command()
def stop(
    directory: Annotated[Path, typer.Argument(help="The run's checkpoint-dir or out-dir.")],
) -> None:
    """Ask a run to stop after its current round (a continuous run, num-rounds = 0): it
    checkpoints, exports, and exits; resume = true continues it."""
    from aggregator.stopping import request_stop

    path = request_stop(directory)
    console.print(f"wrote {path}: the run stops after its current round")


@app.command()
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
    from aggregator.round_log import read_rotated
    from deploy.report import summarize, write_report

    _require("fedstream report", ("matplotlib",))

    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.exists():
        raise _fail(f"{path}: no metrics.jsonl (was out-dir = 'none' in the run config?)")
    try:
        records = read_rotated(path)
    except ValueError as err:
        raise _fail(str(err)) from err
    if not records:
        raise _fail(f"{path}: no rounds yet")
    where = out or path.parent
    where.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, records[-1].run_wall_s)
    (where / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(records, where / "report.png", f"fedstream run: {path.parent.name}")
    last = records[-1]
    console.print(
        f"{len(records)} rounds (to round {last.round}), {last.metric} {summary['final_accuracy']} "
        f"prequential, {summary['test_accuracy']} on eval-data; wrote {where / 'summary.json'} "
        f"and {where / 'report.png'}",
        soft_wrap=True,
    )


@app.command("app")
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
        raise _fail(f"cannot write the app to {directory}: {err}") from err
    console.print(f"wrote {path}: flwr run {directory} <connection> submits it", soft_wrap=True)


@app.command("run-config")
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


@app.command()
def demo(
    devices: Annotated[int, typer.Option(help="Number of simulated devices.")] = DEMO_DEVICES,
    rounds: Annotated[
        int | None,
        typer.Option(help=f"Federated rounds (num-rounds, default {DEMO_SETTINGS['num_rounds']})"),
    ] = None,
    controller: Annotated[
        str | None,
        typer.Option(help=_run_help("controller", "Batch controller: fixed | static | dynamic.")),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help=_run_help(
                "mode",
                "sync rounds, or async (FedBuff: no device waits for the others; --rounds then "
                "counts model versions).",
            )
        ),
    ] = None,
    slowdowns: Annotated[
        str | None, typer.Option(help="Comma-separated slowdown per device (default 1,1,2,4).")
    ] = None,
    rates: Annotated[
        str | None, typer.Option(help="Comma-separated stream rate per device, samples/s.")
    ] = None,
    local_steps: Annotated[
        int | None,
        typer.Option(
            "--local-steps",
            help=f"Steps per round (local-steps, default {DEMO_SETTINGS['local_steps']})",
        ),
    ] = None,
    broker: Annotated[
        str | None, typer.Option(help="Use this broker instead of starting one.")
    ] = None,
    mosquitto: Annotated[
        bool, typer.Option("--mosquitto", help="Start Mosquitto instead of the embedded broker.")
    ] = False,
    capacity: Annotated[int, typer.Option(help="Buffer capacity per device.")] = DEMO_CAPACITY,
    policy: Annotated[Policy, typer.Option(help="Buffer policy.")] = _DEFAULT_POLICY,
    out: Annotated[Path, typer.Option(help="Where runs/<id>/ goes.")] = Path("runs"),
    live: Annotated[bool, typer.Option(help="Live table (off: one table per round).")] = True,
    stream_only: Annotated[
        bool, typer.Option("--stream-only", help="Only the streaming half (no training).")
    ] = False,
    duration: Annotated[
        float, typer.Option(help="Seconds of streaming (--stream-only).")
    ] = DEMO_DURATION_S,
    kill: Annotated[
        list[str] | None, typer.Option(help="Fault injection: DEVICE@ROUND kills its SuperNode.")
    ] = None,
    restart: Annotated[
        list[str] | None,
        typer.Option(help="DEVICE@ROUND starts a killed device's SuperNode again."),
    ] = None,
    round_timeout: Annotated[
        float | None,
        typer.Option(
            "--round-timeout", help=_run_help("round_timeout", "Seconds a round waits for devices.")
        ),
    ] = None,
    compress: Annotated[
        str | None,
        typer.Option(
            help=_run_help(
                "compress", "Update codec: none | fp16 | int8 | topk | adaptive (ScaDLES)."
            )
        ),
    ] = None,
    compress_ratio: Annotated[
        float | None,
        typer.Option(
            "--compress-ratio", help=_run_help("compress_ratio", "Top-k: fraction of values sent.")
        ),
    ] = None,
    compress_broadcast: Annotated[
        str | None,
        typer.Option(
            "--compress-broadcast",
            help=_run_help("compress_broadcast", "Model sent down: none | fp16."),
        ),
    ] = None,
    labels: Annotated[
        int | None, typer.Option(help="Non-IID: K classes per device (round-robin).")
    ] = None,
    dirichlet: Annotated[
        float | None, typer.Option(help="Non-IID: Dirichlet(ALPHA) label mix per device.")
    ] = None,
    inject_alpha: Annotated[
        float | None,
        typer.Option(
            "--inject-alpha",
            help=_run_help("inject_alpha", "ScaDLES injection: fraction of devices sharing."),
        ),
    ] = None,
    inject_beta: Annotated[
        float | None,
        typer.Option(
            "--inject-beta",
            help=_run_help("inject_beta", "... each shares this fraction of samples."),
        ),
    ] = None,
    proximal_mu: Annotated[
        float | None,
        typer.Option("--proximal-mu", help=_run_help("proximal_mu", "FedProx term (0: FedAvg).")),
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option(
            "--run-config",
            help="Any other training setting, as for flwr run: 'key=value ...' "
            "(fedstream run-config lists the keys).",
        ),
    ] = None,
    kill_aggregator: Annotated[
        int | None,
        typer.Option(
            "--kill-aggregator",
            help="Fault injection: SIGKILL the SuperLink and ServerApp after this round, start "
            "the SuperLink again and resume the run from its last checkpoint.",
        ),
    ] = None,
    kill_broker: Annotated[
        int | None,
        typer.Option(
            "--kill-broker",
            help="Fault injection (with --mosquitto): SIGKILL the broker after this round and "
            "start it again 5 s later.",
        ),
    ] = None,
    source: Annotated[
        Path | None,
        typer.Option(
            help="Stream your own recording instead of the synthetic task: an .npz (arrays x "
            "and y) or .csv (label,f1,...) file, split across the devices; its sample shape "
            "and classes set the run's."
        ),
    ] = None,
    test: Annotated[
        Path | None,
        typer.Option(
            help="A test file of the recording (same form): the aggregator scores each round's "
            "model on it (test_accuracy in summary.json)."
        ),
    ] = None,
    task: Annotated[
        str,
        typer.Option(
            help="classification, or forecast: --source is then a recorded series (.npz x of "
            "(T,) or (T, C), or a .csv with a column per channel), cut into windows of "
            "--window readings whose last forecast-horizon (--run-config) are predicted."
        ),
    ] = "classification",
    window: Annotated[
        int, typer.Option(help="--task forecast: readings per window (past + horizon).")
    ] = 32,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Mosquitto with TLS, passwords and per-device ACL; Flower TLS and SuperNode "
            "authentication (keys registered). Everything generated under <run>/secrets.",
        ),
    ] = False,
) -> None:
    """Everything on one machine: streams, ingest, Flower SuperLink + SuperNodes, training."""
    from deploy.demo import DemoConfig, run_demo
    from deploy.flower import FlowerError

    _setup_logging(False)
    logging.getLogger("iotcore").setLevel(logging.WARNING)  # the live table says it all
    # Training options are run-config keys: the demo's flags name the common ones.
    flags = {
        "num_rounds": rounds,
        "local_steps": local_steps,
        "controller": controller,
        "mode": mode,
        "round_timeout": round_timeout,
        "compress": compress,
        "compress_ratio": compress_ratio,
        "compress_broadcast": compress_broadcast,
        "inject_alpha": inject_alpha,
        "inject_beta": inject_beta,
        "proximal_mu": proximal_mu,
    }
    try:
        overrides = _parse_run_config(run_config)
        overrides.update({kebab(k): v for k, v in flags.items() if v is not None})
        config = DemoConfig(
            devices=devices,
            duration=duration,
            rates=[float(r) for r in rates.split(",")] if rates else None,
            broker=broker,
            mosquitto=mosquitto,
            capacity=capacity,
            policy=policy.value,
            out=out,
            live=live,
            slowdowns=[float(s) for s in slowdowns.split(",")] if slowdowns else None,
            stream_only=stream_only,
            run_config=overrides,
            kill=_parse_kills(kill or []),
            restart=_parse_kills(restart or [], "--restart"),
            labels=labels,
            dirichlet=dirichlet,
            secure=secure,
            kill_aggregator=kill_aggregator,
            kill_broker=kill_broker,
            source=source,
            test=test,
            task=task,
            window=window,
        )
    except ValueError as err:
        raise _fail(str(err)) from err
    own_broker = not (config.broker or config.mosquitto or config.secure)
    _require("fedstream demo", ("matplotlib", "iotcore") if own_broker else ("matplotlib",))
    try:
        with _stoppable("the demo"):
            ok = run_demo(config, console=Console())
    except FlowerError as err:
        raise _fail(str(err)) from err
    raise typer.Exit(0 if ok else 1)


def _parse_run_config(text: str | None) -> dict[str, object]:
    """``'key=value ...'`` as ``flwr run --run-config`` reads it (TOML values).

    Raises
    ------
    ValueError
        If it is not in that form.
    """
    if not text:
        return {}
    import click
    from flwr.common.config import parse_config_args

    try:
        return dict(parse_config_args([text]))
    except click.ClickException as err:
        raise ValueError(f"--run-config {text!r}: {err.message}") from err


@app.command()
def resume(
    checkpoint_dir: Annotated[
        Path, typer.Argument(help="The run's checkpoint-dir (holds state.json).")
    ],
    connection: Annotated[
        str | None,
        typer.Option(help="SuperLink connection in $FLWR_HOME/config.toml (default: its default)."),
    ] = None,
    app_dir: Annotated[
        Path | None,
        typer.Option(
            "--app",
            help="The Flower app (folder with pyproject.toml; default: the current directory, "
            "when it holds one). deploy/install.sh writes fedstream's to /opt/fedstream/app.",
        ),
    ] = None,
) -> None:
    """Continue a run after an aggregator crash, from its last checkpoint.

    Submits the run config stored in the checkpoint again with resume=true: same rounds,
    model and settings; the model, controller state and device map come from the checkpoint.
    """
    from deploy.flower import FlowerError, resume_run

    try:
        run_id, last, total = resume_run(checkpoint_dir, app_dir, connection)
    except FlowerError as err:
        raise _fail(str(err)) from err
    if total == 0:
        console.print(f"resumed a continuous run after round {last} as run {run_id}")
    elif last >= total:
        console.print(
            f"the checkpoint already holds all {total} rounds (run {run_id} ends at once)"
        )
    else:
        console.print(f"resumed after round {last} of {total} as run {run_id}")
    print(json.dumps({"run-id": run_id, "resumed-after": last, "num-rounds": total}))


@app.command()
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
    connection: Annotated[
        str | None,
        typer.Option(help="SuperLink connection in $FLWR_HOME/config.toml (default: its default)."),
    ] = None,
    app_dir: Annotated[
        Path | None,
        typer.Option(
            "--app",
            help="The Flower app (folder with pyproject.toml; default: the current directory, "
            "when it holds one).",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Keep a continuous run (num-rounds = 0) going on a SuperLink until SIGTERM; then stop it
    after its current round and exit 0 (the aggregator's systemd unit runs this)."""
    from deploy.aggregator_service import serve as serve_run
    from deploy.flower import FlowerError, find_app

    _setup_logging(verbose)
    try:
        settings = _parse_run_config(run_config)
        code = serve_run(find_app(app_dir), checkpoint_dir, settings, connection)
    except (FlowerError, ValueError) as err:
        raise _fail(str(err)) from err
    raise typer.Exit(code)


Scenario = Enum("Scenario", {n: n for n in [*SCENARIOS, "all"]}, type=str)  # type: ignore[misc]


@app.command()
def bench(
    scenario: Annotated[Scenario, typer.Argument(help="What to measure ('all': every one).")],
    quick: Annotated[bool, typer.Option("--quick", help="Shorter runs (a smoke test).")] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the JSON results here.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where <scenario>.json/.md/.png go.")] = Path(
        "bench/results"
    ),
) -> None:
    """Benchmarks: tables, plots and JSON (on the in-process runner's virtual clock; deployment:
    real Flower processes on the wall clock)."""
    _setup_logging(False)
    _require("fedstream bench")
    names = list(SCENARIOS) if scenario.value == "all" else [scenario.value]
    combined: dict[str, object] = {}
    with _stoppable(f"bench {scenario.value}"):
        _run_benches(names, quick, out, json_path if scenario.value != "all" else None, combined)
    if json_path is not None and scenario.value == "all":
        json_path.write_text(json.dumps(combined, indent=2) + "\n")


def _run_benches(
    names: list[str], quick: bool, out: Path, json_path: Path | None, combined: dict[str, object]
) -> None:
    """Run the benchmarks ``names`` one after another, each result into ``combined``."""
    from deploy.bench import run_scenario

    for name in names:
        console.print(f"[bold]bench {name}[/bold]{' (quick)' if quick else ''}")
        result, paths = run_scenario(name, quick, out, json_path)
        print(result.table, flush=True)
        console.print("wrote " + ", ".join(str(p) for p in paths))
        combined[name] = json.loads((out / f"{name}.json").read_text())


def _parse_kills(specs: list[str], option: str = "--kill") -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs:
        dev, sep, after = spec.partition("@")
        if not sep or not after.isdigit():
            raise ValueError(f"{option} takes DEVICE@ROUND, got {spec!r}")
        out[dev] = int(after)
    return out


def main() -> None:
    """Entry point of the ``fedstream`` console script."""
    app()
