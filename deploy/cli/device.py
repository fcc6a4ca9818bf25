"""Commands run on a device: ingest, infer, status, publish."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console

from deploy.cli.common import console, fail, parse_shape, run_daemon, setup_logging
from deploy.cli.options import (
    DEFAULT_BROKER_URL,
    DISTRIBUTION_DEFAULT,
    NO_CREDENTIALS,
    NO_READINGS,
    POLICY_DEFAULT,
    POSITIVE,
    BrokerOption,
    Credentials,
    DaemonConnectTimeoutOption,
    Distribution,
    MaxPayloadOption,
    MetricsListenOption,
    MetricsPortOption,
    Policy,
    RateSet,
    Readings,
    RuntimeApiOption,
    SuperExecSecretOption,
    VerboseOption,
    broker_options,
    reading_option,
    with_credentials,
    with_readings,
)
from edge_client.emulation.constants import PUBLISH_CONNECT_TIMEOUT_S, PUBLISH_PROGRESS_S
from edge_client.runtime.constants import (
    AGENT_THREADS,
    COMMIT_INTERVAL_S,
    DEFAULT_CAPACITY,
    DEFAULT_LABEL_WAIT_S,
    INGEST_SESSION_EXPIRY_S,
    MAX_COMMIT_INTERVAL_S,
    RATE_LOG_S,
    STATUS_INTERVAL_S,
)
from edge_client.runtime.drift_watch import DEFAULT_DELTA
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE, DIGITS_SHAPE
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES

if TYPE_CHECKING:
    from edge_client.emulation import PublisherConfig, SampleSource, SeriesReadings
    from edge_client.runtime.agent import DeviceAgent
    from edge_client.runtime.task_taker import TaskTaker
    from edge_client.runtime.windowing import WindowSpec

__all__ = ["infer", "ingest", "publish", "status"]


def _window_spec(device_id: str, readings: Readings, **labels: Any) -> WindowSpec | None:
    """The windowing of per-reading JSON that ``ingest`` and ``infer`` options describe
    (``readings``, and ``ingest``'s ``labels``; None without ``--window``).

    Raises
    ------
    ValueError
        If the options contradict each other.
    """
    from edge_client.runtime.windowing import WindowSpec
    from edge_client.wire import samples_topic

    if readings["window"] is None:
        if readings["fields"] or readings["payload"] != "json":
            raise ValueError("a per-reading stream needs --window (readings per sample)")
        return None
    return WindowSpec.from_options(
        topics=readings["topic"] or [samples_topic(device_id)],
        fields=readings["fields"],
        window=readings["window"],
        stride=readings["stride"] or 0,
        time_field=readings["time_field"],
        time_unit=readings["time_unit"],
        payload=readings["payload"],
        time_zone=readings["time_zone"],
        hold=readings["report_on_change"],
        rebirth=readings["sparkplug_rebirth"],
        max_gap=readings["max_gap"],
        rate=readings["rate"],
        max_skew=readings["max_skew"],
        **labels,
    )


@with_credentials
def publish(
    device_id: Annotated[str, typer.Option("--device-id", help="Device the stream feeds.")],
    broker: BrokerOption = DEFAULT_BROKER_URL,
    rate: Annotated[float | None, typer.Option(help="Samples per second.")] = None,
    rate_set: Annotated[
        RateSet | None, typer.Option("--rate-set", help="Draw the rate from a ScaDLES set.")
    ] = None,
    distribution: Annotated[
        Distribution, typer.Option(help="Arrival process.")
    ] = DISTRIBUTION_DEFAULT,
    batch: Annotated[int, typer.Option(help="Samples per message.", min=1)] = 1,
    count: Annotated[
        int | None,
        typer.Option(
            help="Stop after this many samples (neither this nor --duration: run "
            "until SIGTERM or Ctrl+C, as a sensor does).",
            min=1,
        ),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds.", click_type=POSITIVE)
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            help="'synthetic', 'digits' (8x8 frames, scikit-learn), or an .npz (x, y) or "
            ".csv (label,f1,...) file."
        ),
    ] = "synthetic",
    labels: Annotated[
        int | None,
        typer.Option(
            help="Pathological skew: K classes per device, picked by --seed and id.", min=1
        ),
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="Only these classes, e.g. '0,3' (label skew).")
    ] = None,
    dirichlet: Annotated[
        float | None,
        typer.Option(help="Class mix drawn from Dirichlet(ALPHA).", click_type=POSITIVE),
    ] = None,
    feature_shift: Annotated[
        float, typer.Option("--feature-shift", help="Per-device sensor gain/bias scale.")
    ] = 0.0,
    shape: Annotated[str, typer.Option(help="Synthetic/CSV sample shape.")] = "6,32",
    num_classes: Annotated[
        int,
        typer.Option(
            "--num-classes",
            help="Classes of the labels (the device's ingest --num-classes).",
            min=1,
        ),
    ] = DEFAULT_NUM_CLASSES,
    qos: Annotated[int, typer.Option(help="MQTT QoS.", min=0, max=2)] = 1,
    seed: Annotated[int, typer.Option(help="Seed for rate, samples and arrivals.")] = 0,
    credentials: Credentials = NO_CREDENTIALS,
    connect_timeout: Annotated[
        float,
        typer.Option(
            "--connect-timeout",
            help="Give up if not connected by then (s).",
            click_type=POSITIVE,
        ),
    ] = PUBLISH_CONNECT_TIMEOUT_S,
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
    style: Annotated[
        str,
        typer.Option(
            "--style",
            help="With --readings, publish as such a device does: json (fedstream's "
            "per-reading JSON), esphome (a bare value per channel topic), zigbee2mqtt (JSON "
            "without a timestamp) or tasmota (a local time without a zone); prints the "
            "ingest options that read it.",
        ),
    ] = "json",
    time_zone: Annotated[
        str | None,
        typer.Option("--time-zone", help="--style tasmota: the IANA zone of its local times."),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(
            help="Publish here instead of fedstream/v1/<id>/samples (or the --style's own "
            "topic; esphome: a + where the channel's name goes)."
        ),
    ] = None,
    max_payload: MaxPayloadOption = DEFAULT_MAX_PAYLOAD_BYTES,
    verbose: VerboseOption = False,
) -> None:
    """Publish a sensor stream at a rate; prints the achieved rate at the end."""
    from edge_client.emulation import PublisherConfig, SeriesReadings, draw_rate
    from edge_client.runtime import device_rng
    from edge_client.wire import validate_device_id

    setup_logging(verbose)
    try:
        validate_device_id(device_id)
        url = broker_options(broker, credentials, connect_timeout)
        if (rate is None) == (rate_set is None):
            raise ValueError("give exactly one of --rate and --rate-set")
        if rate_set is not None:
            rate = draw_rate(rate_set.value, device_rng(seed, device_id, 1))
        assert rate is not None
        if labels is not None and classes is not None:
            raise ValueError("give --labels K or --classes LIST, not both")
        skew = _Skew(labels, classes, dirichlet, feature_shift, num_classes, seed)
        if style != "json" and not readings:
            raise ValueError("--style replays a series reading by reading: give --readings")
        replay = _Replay(style, time_zone, topic)
        src = _publish_source(source, readings, shape, rate, device_id, skew, replay)
        if isinstance(src, SeriesReadings) and style != "json":
            _print_ingest_options(device_id, src)
            topic = None  # the style's topics: the source's
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
            topic=topic,
            max_payload=max_payload,
        )
    except (ValueError, OSError) as err:
        raise fail(str(err)) from err
    unit = "readings" if readings else "samples"
    console.print(
        f"publishing to {url} as {device_id}: {rate:.1f} {unit}/s, "
        f"{batch} per message, {distribution.value}"
    )
    _run_publisher(config, src, unit, progress_interval, json_out)


@dataclass(frozen=True)
class _Skew:
    """``publish``'s label and feature skew options, and what draws them."""

    labels: int | None
    classes: str | None
    dirichlet: float | None
    feature_shift: float
    num_classes: int
    seed: int


@dataclass(frozen=True)
class _Replay:
    """How ``publish --readings`` sends a series: ``--style``, ``--time-zone``, ``--topic``."""

    style: str
    time_zone: str | None
    topic: str | None


def _print_ingest_options(device_id: str, src: SeriesReadings) -> None:
    """Say which ``fedstream ingest`` options read a styled replay back."""
    from edge_client.emulation.reading_styles import ingest_options

    assert src.topic is not None
    options = ingest_options(src.style, src.topic, src.names, src.time_zone)
    # one stream a channel: aligned by --rate
    rate_too = src.style in ("esphome", "sparkplug") and len(src.names) > 1
    console.print(
        f"read it with: fedstream ingest --device-id {device_id} "
        + " ".join(shlex.quote(o) for o in options)
        + " --window W"
        + (" --rate R" if rate_too else ""),
        soft_wrap=True,
    )


def _publish_source(
    source: str,
    readings: bool,
    shape: str,
    rate: float,
    device_id: str,
    skew: _Skew,
    replay: _Replay,
) -> SampleSource | SeriesReadings:
    """What ``publish`` sends: the synthetic task, the digits, a recording of samples (checked
    against the shape and classes the device's ingest declares) or a series, reading by
    reading.

    Raises
    ------
    ValueError, OSError
        If the options contradict each other or the file cannot be read.
    """
    from edge_client.emulation import (
        ArraySource,
        SeriesReadings,
        SyntheticSource,
        dataset_source,
        label_distribution,
        pick_classes,
    )
    from edge_client.runtime import device_rng
    from edge_client.task import SensorTask, load_dataset, load_recording

    num_classes, seed = skew.num_classes, skew.seed
    rng = device_rng(seed, device_id, 2)
    label_list = [int(k) for k in skew.classes.split(",")] if skew.classes else None
    if skew.labels is not None:
        label_list = pick_classes(skew.labels, num_classes, rng=device_rng(seed, device_id, 3))
    probs = label_distribution(num_classes, rng, label_list, skew.dirichlet)
    if readings:
        if source in ("synthetic", "digits") or label_list or skew.dirichlet is not None:
            raise ValueError("--readings replays a series file: give --source FILE, no skew")
        from edge_client.emulation.reading_styles import default_topic

        topic = replay.topic or default_topic(replay.style, device_id)  # None: fedstream's
        return SeriesReadings.from_file(source, rate, replay.style, replay.time_zone, topic)
    if source == "synthetic":
        task = SensorTask(parse_shape(shape), num_classes)
        return SyntheticSource(task, rng, probs, skew.feature_shift)
    if source == "digits":  # 8x8 camera frames (ingest with --shape 8,8 --num-classes 10)
        digits = load_dataset("digits", DIGITS_SHAPE, num_classes)
        return dataset_source(digits, rng, probs, skew.feature_shift)
    declared = parse_shape(shape)
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
    skewed = label_list is not None or skew.dirichlet is not None
    return ArraySource(x, y, rng, probs if skewed else None)


def _run_publisher(
    config: PublisherConfig,
    src: SampleSource | SeriesReadings,
    unit: str,
    progress_interval: float,
    json_out: bool,
) -> None:
    """Publish until done or stopped (SIGTERM, Ctrl-C: drain, report, exit 0), with progress
    lines on stderr; then the report."""
    from edge_client.emulation import run_publisher
    from edge_client.runtime.signals import set_on_signals

    count, duration = config.count, config.duration

    def progress(sent: int, acknowledged: int, elapsed: float) -> None:
        of = f" of {count}" if count else ""
        share = sent / count if count else elapsed / duration if duration else None
        console.print(
            f"sent {sent}{of} {unit}{'' if share is None else f' ({share:.0%})'} in "
            f"{elapsed:.1f} s: {sent / elapsed:.1f} "
            f"{unit}/s; {acknowledged} messages acknowledged",
            soft_wrap=True,
        )

    # a stop signal stops it cleanly: drain, report, exit 0
    with set_on_signals() as stop:
        try:
            report = run_publisher(
                config,
                src,
                stop=stop,
                on_progress=progress if progress_interval > 0 else None,
                progress_interval=progress_interval,
            )
        except (ConnectionError, ValueError) as err:  # ValueError: its TLS files
            raise fail(str(err)) from err
    if json_out:
        print(json.dumps(report.as_dict()), flush=True)
    console.print(
        f"published {report.samples} samples in {report.messages} messages over "
        f"{report.elapsed_s:.1f} s: achieved {report.achieved_rate:.1f} samples/s "
        f"(target {report.target_rate:.1f}); {report.acknowledged} acknowledged"
        + "".join(f"; {n} refused: {why}" for why, n in report.refused.items())
    )


@with_credentials
@with_readings
def ingest(
    device_id: Annotated[str, typer.Option("--device-id", help="This device's id.")],
    buffer: Annotated[Path, typer.Option(help="The SQLite buffer file.")],
    broker: BrokerOption = DEFAULT_BROKER_URL,
    policy: Annotated[Policy, typer.Option(help="Overflow policy.")] = POLICY_DEFAULT,
    capacity: Annotated[int, typer.Option(help="Maximum samples held.", min=1)] = DEFAULT_CAPACITY,
    capacity_bytes: Annotated[
        int | None, typer.Option("--capacity-bytes", help="Also cap the buffer in bytes.", min=1)
    ] = None,
    shape: Annotated[
        str | None,
        typer.Option(help="Declared sample shape (default 6,32; with --window: channels,window)."),
    ] = None,
    num_classes: Annotated[
        int | None,
        typer.Option(
            "--num-classes",
            help=f"Classes of integer labels (default {DEFAULT_NUM_CLASSES}).",
            min=1,
        ),
    ] = None,
    status_interval: Annotated[
        float,
        typer.Option(
            "--status-interval", help="Seconds between status messages.", click_type=POSITIVE
        ),
    ] = STATUS_INTERVAL_S,
    log_interval: Annotated[
        float,
        typer.Option(
            "--log-interval",
            help="Seconds between the log's lines of what came in.",
            click_type=POSITIVE,
        ),
    ] = RATE_LOG_S,
    session_expiry: Annotated[
        int,
        typer.Option(
            "--session-expiry",
            help="Seconds the broker keeps this daemon's session, and queues its messages, "
            "while it is away (MQTT 5); 0: none.",
            min=0,
        ),
    ] = INGEST_SESSION_EXPIRY_S,
    commit_interval: Annotated[
        float,
        typer.Option(
            "--commit-interval",
            help="Longest seconds one SQLite transaction gathers messages: longer writes less "
            "per sample (SD cards) and loses nothing (messages are acknowledged once committed).",
            click_type=click.FloatRange(0, MAX_COMMIT_INTERVAL_S, min_open=True),
        ),
    ] = COMMIT_INTERVAL_S,
    credentials: Credentials = NO_CREDENTIALS,
    inject: Annotated[
        bool,
        typer.Option(
            "--inject",
            help="Opt in to data injection: keep others' shared samples, publish ours.",
        ),
    ] = False,
    readings: Readings = NO_READINGS,
    availability: Annotated[
        list[str] | None,
        reading_option(
            "A sensor's availability topic (online/offline, as ESPHome, Home Assistant, "
            "Zigbee2MQTT and Tasmota publish it; repeatable, wildcards allowed): its state is "
            "shown in the status and the fleet view, nothing is buffered.",
            "--availability-topic",
        ),
    ] = None,
    label_field: Annotated[
        str | None,
        reading_option(
            "The label's field (on the first --topic, or on --label-topic); none: label-free.",
            "--label-field",
        ),
    ] = None,
    label_topic: Annotated[
        str | None,
        reading_option("Labels arrive on this topic, joined by timestamp.", "--label-topic"),
    ] = None,
    classes: Annotated[
        str | None, reading_option("Class names of string labels, in index order: walk,run,sit.")
    ] = None,
    label_wait: Annotated[
        float,
        reading_option("Seconds of stream time a sample waits for its label.", "--label-wait"),
    ] = DEFAULT_LABEL_WAIT_S,
    seq_field: Annotated[
        str | None,
        reading_option(
            "The sensor's reading counter, if it sends one: a jump counts readings that "
            "never arrived (status readings-missing).",
            "--seq-field",
        ),
    ] = None,
    connect_timeout: DaemonConnectTimeoutOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_listen: MetricsListenOption = "0.0.0.0",
    verbose: VerboseOption = False,
) -> None:
    """Run the ingest daemon: MQTT samples into the device's durable buffer.

    Sample frames by default; with --window, per-reading JSON cut into windows of readings.
    """
    from edge_client.runtime.buffer import BufferStoreError
    from edge_client.runtime.ingest import IngestConfig, IngestDaemon

    setup_logging(verbose)
    try:
        if readings["window"] is None and (label_field or label_topic or classes or seq_field):
            raise ValueError("per-reading JSON needs --window (readings per sample)")
        spec = _window_spec(
            device_id, readings, label_field=label_field, label_topic=label_topic,
            classes=classes, num_classes=num_classes or 0, label_wait=label_wait,
            seq_field=seq_field,
        )  # fmt: skip
        url = broker_options(broker, credentials, connect_timeout)
        config = IngestConfig(
            broker=url,
            device_id=device_id,
            buffer=buffer,
            policy=policy.value,
            capacity=capacity,
            capacity_bytes=capacity_bytes,
            shape=parse_shape(shape) if shape else DEFAULT_SHAPE,  # checked against --window
            num_classes=num_classes or DEFAULT_NUM_CLASSES,
            status_interval=status_interval,
            log_interval=log_interval,
            commit_interval=commit_interval,
            session_expiry=session_expiry,
            inject=inject,
            topics=tuple(readings["topic"] or ()) if spec is None else (),
            windowing=spec,
            metrics_port=metrics_port,
            metrics_listen=metrics_listen,
            availability=tuple(availability or ()),
        )
        daemon = IngestDaemon(config)
    except (ValueError, BufferStoreError, OSError) as err:
        raise fail(str(err)) from err
    run_daemon(daemon)


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
        raise fail(str(err)) from err
    if json_out:
        print(json.dumps(stats))
        return
    table = Table(title=str(buffer), show_header=False)
    for key, value in stats.items():
        table.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    Console().print(table)


@with_credentials
@with_readings
def infer(
    device_id: Annotated[str, typer.Option("--device-id", help="This device's id.")],
    model: Annotated[
        Path,
        typer.Option(
            help="Model directory to follow: the device's model-dir (node config) or an "
            "export-dir; the newest version is run, newer ones picked up as they appear."
        ),
    ],
    broker: BrokerOption = DEFAULT_BROKER_URL,
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
        float,
        typer.Option(
            "--drift-delta",
            help="ADWIN's confidence (smaller: surer, later).",
            click_type=click.FloatRange(0, 1, min_open=True, max_open=True),
        ),
    ] = DEFAULT_DELTA,
    connect_timeout: DaemonConnectTimeoutOption = None,
    credentials: Credentials = NO_CREDENTIALS,
    readings: Readings = NO_READINGS,
    max_payload: MaxPayloadOption = DEFAULT_MAX_PAYLOAD_BYTES,
    agent_socket: Annotated[
        Path | None,
        typer.Option(
            "--agent-socket",
            help="Also serve as this device's agent on this Unix socket (the ClientApp's "
            "node config names it as agent): training and inference share one torch process.",
        ),
    ] = None,
    runtime_api: RuntimeApiOption = None,
    secret_file: SuperExecSecretOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the newest model on every sample of the device's stream; publish predictions to
    fedstream/v1/<device-id>/predictions."""
    from edge_client.runtime.infer import InferConfig, InferenceDaemon

    setup_logging(verbose)
    try:
        spec = _window_spec(device_id, readings)
        url = broker_options(broker, credentials, connect_timeout)
        daemon = InferenceDaemon(
            InferConfig(
                broker=url,
                device_id=device_id,
                model_dir=model,
                buffer=buffer,
                topics=tuple(readings["topic"] or ()) if spec is None else (),
                windowing=spec,
                drift=drift,
                drift_delta=drift_delta,
                max_payload=max_payload,
            )
        )
    except (ValueError, OSError) as err:
        raise fail(str(err)) from err
    try:
        tasks = _task_taker(runtime_api, secret_file, device_id)
    except (PermissionError, OSError, ValueError) as err:
        raise fail(str(err), code=1) from err
    if agent_socket is None and tasks is None:
        run_daemon(daemon)
        return
    # Also this device's agent (its SuperNode's tasks, its ClientApps' socket, or both):
    # training and inference share one torch process.
    agent = _start_agent(agent_socket, device_id, tasks)
    try:
        run_daemon(daemon)
    finally:
        agent.stop()


def agent(
    socket_path: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            help="A Unix socket to serve ClientApps on (node config agent=<socket>; its "
            "directory is made private to this user).",
        ),
    ] = None,
    runtime_api: RuntimeApiOption = None,
    secret_file: SuperExecSecretOption = None,
    device_id: Annotated[
        str | None,
        typer.Option("--device-id", help="Serve only this device (others are refused)."),
    ] = None,
    threads: Annotated[int, typer.Option(help="torch intra-op threads.", min=1)] = AGENT_THREADS,
    verbose: VerboseOption = False,
) -> None:
    """Serve this device's training with torch, the task and the model loaded once: its
    SuperNode's tasks (--runtime-api), or the ClientApps that hand their message over
    (--socket, node config agent=<socket>)."""
    from edge_client.runtime.agent import DeviceAgent

    setup_logging(verbose)
    if socket_path is None and runtime_api is None:
        raise fail("give --runtime-api HOST:PORT (take the SuperNode's tasks), --socket, or both")
    try:
        tasks = _task_taker(runtime_api, secret_file, device_id)
        DeviceAgent(socket_path, threads=threads, device_id=device_id, tasks=tasks).run()
    except (PermissionError, OSError, ValueError) as err:
        raise fail(str(err), code=1) from err


def _task_taker(
    runtime_api: str | None, secret_file: Path | None, device_id: str | None
) -> TaskTaker | None:
    """The agent's taker of its SuperNode's tasks (None without ``--runtime-api``).

    Raises
    ------
    typer.Exit
        If only one of ``--runtime-api`` and ``--superexec-auth-secret-file`` is given.
    PermissionError, OSError, ValueError
        If the secret file cannot be read or others may read it.
    """
    from edge_client.runtime.task_taker import TaskTaker, read_secret
    from edge_client.task_wake import wake_path

    if (runtime_api is None) != (secret_file is None):
        raise fail("--runtime-api and --superexec-auth-secret-file go together")
    if runtime_api is None or secret_file is None:
        return None
    return TaskTaker(
        runtime_api,
        read_secret(secret_file),
        device_id,
        inflight=secret_file.with_name(f"{secret_file.name}.task"),
        wake=wake_path(secret_file),
    )


def _start_agent(
    socket_path: Path | None, device_id: str, tasks: TaskTaker | None = None
) -> DeviceAgent:
    """A device agent serving in this process's background (``infer --agent-socket``,
    ``--runtime-api``)."""
    from edge_client.runtime.agent import DeviceAgent

    agent = DeviceAgent(socket_path, device_id=device_id, tasks=tasks)
    try:
        agent.start()
    except OSError as err:
        raise fail(str(err), code=1) from err
    return agent
