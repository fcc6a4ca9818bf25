"""``fedstream demo``: everything on one machine, with a live view and a summary.

This is the streaming half of the system: a broker, one publisher and one ingest daemon per
simulated device, each device's buffer filling at its own rate. Every process it starts is
stopped (by pid) when it ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from aggregator.round_log import RoundRecord, divergence_hint, read_metrics
from deploy.brokers import (
    BROKER_CONFIG_DIR,
    EmbeddedBroker,
    MosquittoBroker,
    mosquitto_available,
)
from deploy.constants import (
    DEFAULT_MQTT_PORT,
    DEMO_BATCH,
    DEMO_CAPACITY,
    DEMO_DEVICES,
    DEMO_DURATION_S,
    DEMO_MODELS,
    DEMO_OWNED,
    DEMO_SEED,
    DEMO_SETTINGS,
    DEMO_STREAMED,
    FORECAST_LR,
)
from deploy.flower import FlowerDeployment, FlowerError
from deploy.local import ProcessGroup, fedstream_command
from deploy.report import summarize, write_report
from deploy.secure import RunSecrets, make_run_secrets
from edge_client.emulation.reading_replay import series_channels
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.buffer import BufferStore, BufferStoreError
from edge_client.runtime.constants import COMMIT_INTERVAL_S, DEFAULT_POLICY, POLICIES
from edge_client.runtime.mqtt import BrokerURL
from edge_client.runtime.node_config import NodeConfig
from edge_client.task.recordings import Recording, load_recording, load_series, series_windows
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings

__all__ = ["DemoConfig", "run_demo", "run_stream_demo"]

DRAIN_TIMEOUT_S = 30.0
PUBLISH_FOREVER_S = 86_400.0  # training mode: publishers run until the demo stops them


@dataclass
class DemoConfig:
    """Options of ``fedstream demo``.

    The training itself is configured like any run, by run-config keys: ``run_config``
    holds the overrides (``--rounds``, ``--controller``, ... and ``--run-config``), checked
    by :class:`~edge_client.wire.run_config.RunSettings` over the demo's own defaults
    (:data:`~deploy.constants.DEMO_SETTINGS`, ``b-min`` and ``min-nodes`` for the fleet).
    The checked result is :attr:`settings`. Keys the demo sets itself
    (:data:`~deploy.constants.DEMO_OWNED`) or that its streams fix
    (:data:`~deploy.constants.DEMO_STREAMED`) are refused.

    The devices stream the synthetic sensor task (scored on its held-out set too), or a
    user's recording (``source``: an ``.npz`` or ``.csv`` file, shuffled and split across
    the devices): its sample shape and classes then set the run's, the model is the CNN for
    ``(channels, steps)`` windows and the MLP for any other shape (``--run-config model=``
    chooses), and a ``test`` file, when given, is what the aggregator scores on.
    """

    devices: int = DEMO_DEVICES
    duration: float = DEMO_DURATION_S
    rates: list[float] | None = None
    broker: str | None = None
    mosquitto: bool = False
    capacity: int = DEMO_CAPACITY
    policy: str = DEFAULT_POLICY
    out: Path = field(default_factory=lambda: Path("runs"))
    live: bool = True
    slowdowns: list[float] | None = None
    stream_only: bool = False
    run_config: dict[str, Any] = field(default_factory=dict)  # kebab-case overrides
    kill: dict[str, int] = field(default_factory=dict)  # device -> after which round
    restart: dict[str, int] = field(default_factory=dict)  # killed device -> back after round
    labels: int | None = None  # non-IID: classes per device (round-robin over the fleet)
    dirichlet: float | None = None  # non-IID: Dirichlet(alpha) label mix per device
    secure: bool = False  # Mosquitto TLS + passwords + ACL, Flower TLS + SuperNode auth
    kill_aggregator: int | None = None  # SIGKILL SuperLink + ServerApp after round N, resume
    # SIGKILL Mosquitto after round N, start it again BROKER_OUTAGE_S later
    kill_broker: int | None = None
    source: Path | None = None  # a user's recording to stream instead of the synthetic task
    test: Path | None = None  # ... and a test file of it for the aggregator
    task: str = "classification"  # or forecast: a recorded series, windows cut from it
    window: int = 32  # forecast: readings per sample (the past and the horizon)
    commit_interval: float = COMMIT_INTERVAL_S  # the ingest daemons' --commit-interval
    settings: RunSettings = field(init=False)
    recording: Recording | None = field(init=False, default=None, repr=False)
    # forecast: the series (T, C), published reading by reading, and its channels' names
    series: np.ndarray | None = field(init=False, default=None, repr=False)
    channels: list[str] = field(init=False, default_factory=list)
    test_windows: np.ndarray | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.devices <= 64:
            raise ValueError(f"--devices must be in 1..64, got {self.devices}")
        if not self.duration > 0:
            raise ValueError(f"--duration must be > 0, got {self.duration}")
        if self.rates is None:  # heterogeneous by default
            pattern = (
                [50.0, 100.0, 200.0, 400.0] if self.stream_only else [400.0, 300.0, 200.0, 150.0]
            )
            self.rates = [pattern[i % 4] for i in range(self.devices)]
        if len(self.rates) != self.devices or min(self.rates) <= 0:
            raise ValueError(f"--rates needs {self.devices} positive values, got {self.rates}")
        if self.slowdowns is None:  # as OmniLearn's heterogeneity: two fast, one 2x, one 4x
            self.slowdowns = [[1.0, 1.0, 2.0, 4.0][i % 4] for i in range(self.devices)]
        if len(self.slowdowns) != self.devices or min(self.slowdowns) < 1:
            raise ValueError(f"--slowdowns needs {self.devices} values >= 1, got {self.slowdowns}")
        owned = sorted(set(self.run_config) & {kebab(k) for k in DEMO_OWNED})
        if owned:
            raise ValueError(
                f"the demo sets {owned} itself (--out chooses where the run goes; resume with "
                "fedstream resume)"
            )
        streamed = sorted(set(self.run_config) & {kebab(k) for k in DEMO_STREAMED})
        if streamed:
            raise ValueError(
                f"the demo's streams set {streamed}: stream a recording of another shape with "
                "--source FILE"
            )
        asked = RunSettings.from_run_config(
            {
                **{kebab(k): v for k, v in DEMO_SETTINGS.items()},
                **self._data_config(),
                **self.run_config,
            }
        )
        # Every device gets at least b-min: lower it for a fleet that B cannot give that.
        b_min = asked.b_min
        if kebab("b_min") not in self.run_config:
            b_min = max(1, min(b_min, asked.global_batch // self.devices))
        self.settings = replace(asked, b_min=b_min, min_nodes=self.devices)
        rounds = self.settings.num_rounds
        if rounds < 1:
            raise ValueError(
                "the demo runs a fixed number of rounds: num-rounds must be >= 1 (a run "
                "that trains until stopped is `fedstream serve` on a SuperLink)"
            )
        unknown = set(self.kill) - set(_device_ids(self.devices))
        if unknown:
            raise ValueError(f"--kill names unknown devices {sorted(unknown)}")
        for dev, after in self.restart.items():
            if dev not in self.kill or after < self.kill[dev]:
                raise ValueError(f"--restart {dev}@{after} needs --kill {dev}@N with N <= {after}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}")
        if self.capacity < 1:
            raise ValueError("--capacity must be >= 1")
        if not 0 < self.commit_interval <= 60:
            raise ValueError("the ingest commit interval must be in (0, 60] s")
        classes = self.settings.num_classes
        if self.labels is not None and not 1 <= self.labels <= classes:
            raise ValueError(f"--labels must be in 1..{classes}")
        if self.labels is not None and self.dirichlet is not None:
            raise ValueError("give --labels or --dirichlet, not both")
        if self.dirichlet is not None and not self.dirichlet > 0:
            raise ValueError("--dirichlet must be > 0")
        if self.broker is not None:
            BrokerURL.parse(self.broker)
        if self.secure and self.broker is not None:
            raise ValueError(
                "--secure starts its own Mosquitto with the run's credentials: drop --broker"
            )
        if self.kill_aggregator is not None and not 1 <= self.kill_aggregator < rounds:
            raise ValueError(f"--kill-aggregator must be in 1..{rounds - 1} (--rounds - 1)")
        if self.kill_broker is not None:
            if not 1 <= self.kill_broker < rounds:
                raise ValueError(f"--kill-broker must be in 1..{rounds - 1} (--rounds - 1)")
            if not (self.mosquitto or self.secure):
                raise ValueError("--kill-broker needs the demo's Mosquitto: add --mosquitto")
        if self.secure and not mosquitto_available():
            raise ValueError("--secure needs Mosquitto (apt-get install -y mosquitto)")

    def _data_config(self) -> dict[str, Any]:
        """Run-config keys of what the devices stream: the synthetic task, scored on its
        held-out set, or the recording's shape and classes, scored on the test file.

        Raises
        ------
        ValueError
            If a file cannot be read, holds fewer samples than devices, or the test file's
            samples are not of the recording's shape or classes.
        """
        if self.source is None:
            if self.test is not None:
                raise ValueError("--test scores a recording: give its --source too")
            if self.task != "classification":
                raise ValueError(f"--task {self.task} learns from a recording: give --source")
            return {kebab("eval_data"): "synthetic"}
        if self.task == "forecast":
            return self._forecast_config(self.source, self.test)
        if self.task != "classification":
            raise ValueError(f"--task must be classification or forecast, got {self.task!r}")
        x, y = load_recording(self.source)
        if len(x) < self.devices:
            raise ValueError(f"{self.source}: {len(x)} samples for {self.devices} devices")
        self.recording = (x, y)
        shape = tuple(int(d) for d in x.shape[1:])
        classes = max(2, int(y.max()) + 1)
        config: dict[str, Any] = {
            kebab("sample_shape"): ",".join(map(str, shape)),
            kebab("num_classes"): classes,
            kebab("model"): "cnn" if len(shape) == 2 else "mlp",
            kebab("eval_data"): "",
        }
        if self.test is not None:
            x_test, y_test = load_recording(self.test, shape)
            if tuple(x_test.shape[1:]) != shape or int(y_test.max()) >= classes:
                raise ValueError(
                    f"{self.test}: samples of shape {tuple(x_test.shape[1:])} and labels up "
                    f"to {int(y_test.max())}; {self.source} has {shape} and {classes} classes"
                )
            config[kebab("eval_data")] = str(self.test.resolve())
        return config

    def _forecast_config(self, source: Path, test: Path | None) -> dict[str, Any]:
        """A recorded series, split in time across the devices, each publishing its stretch
        as per-reading JSON that its ingest daemon cuts into windows of ``window`` readings
        (stride 1, no labels); ``test``, a later stretch, is cut the same way for the
        aggregator."""
        series = load_series(source)
        if len(series) // self.devices < self.window:
            raise ValueError(
                f"{source}: {len(series)} readings make no window of {self.window} for each "
                f"of {self.devices} devices"
            )
        self.series, self.channels = series, series_channels(source)
        config: dict[str, Any] = {
            kebab("task"): "forecast",
            kebab("sample_shape"): f"{series.shape[1]},{self.window}",
            kebab("eval_data"): "",
            kebab("lr"): FORECAST_LR,  # --run-config lr=... still wins
        }
        if test is not None:
            test_windows = series_windows(load_series(test), self.window)
            if test_windows.shape[1] != series.shape[1]:
                raise ValueError(f"{test}: {test_windows.shape[1]} channels, {source} has "
                                 f"{series.shape[1]}")  # fmt: skip
            self.test_windows = test_windows  # eval-data: <run>/data/test.npz, with the shards
        return config

    @property
    def inject(self) -> bool:
        """Whether the devices take part in data injection (the run asks for it)."""
        return self.settings.inject_alpha > 0


@dataclass
class _Streams:
    """Where the demo's MQTT clients connect, and as whom."""

    url: str
    secrets: RunSecrets | None = None
    mosquitto: MosquittoBroker | None = None  # the demo's own, for broker fault injection

    def client_args(self, dev: str) -> tuple[list[str], dict[str, str]]:
        """Options and environment of ``fedstream publish|ingest`` for device ``dev``."""
        if self.secrets is None:
            return ["--broker", self.url], {}
        return (
            ["--broker", self.url, "--username", dev, "--cafile", str(self.secrets.ca)],
            {"FEDSTREAM_MQTT_PASSWORD": self.secrets.password(dev)},  # not on command lines
        )


@contextlib.contextmanager
def _broker(
    config: DemoConfig, console: Console, secrets: RunSecrets | None = None
) -> Iterator[_Streams]:
    if config.broker is not None:
        yield _Streams(config.broker)
        return
    if secrets is not None:  # the production config: TLS listener first, then plain + auth
        with MosquittoBroker(BROKER_CONFIG_DIR / "mosquitto-prod.conf", secrets.root) as prod:
            url = f"mqtts://127.0.0.1:{prod.port}"
            console.print(
                f"[bold]broker[/bold]: Mosquitto on {url} (TLS, a password and an ACL per device)"
            )
            yield _Streams(url, secrets, prod)
        return
    if config.mosquitto:  # persistence on, as in production
        with MosquittoBroker(persist=True) as mosquitto:
            console.print(f"[bold]broker[/bold]: Mosquitto on {mosquitto.url}")
            yield _Streams(mosquitto.url, mosquitto=mosquitto)
        return
    with EmbeddedBroker() as embedded:
        console.print(f"[bold]broker[/bold]: embedded broker (iotcore) on {embedded.url}")
        yield _Streams(embedded.url)


def _device_ids(n: int) -> list[str]:
    return [f"dev-{i}" for i in range(n)]


def _read_stats(
    paths: dict[str, Path], stores: dict[str, BufferStore]
) -> dict[str, dict[str, Any]]:
    stats: dict[str, dict[str, Any]] = {}
    for dev, path in paths.items():
        if dev not in stores:
            try:
                stores[dev] = BufferStore(path)
            except BufferStoreError:
                continue  # the daemon has not created it yet
        stats[dev] = stores[dev].stats()
    return stats


def _table(
    config: DemoConfig,
    stats: dict[str, dict[str, Any]],
    published: dict[str, int],
    elapsed: float,
    title: str,
) -> Table:
    table = Table(
        title=f"{title}: {elapsed:.0f} s of {config.duration:.0f} s, "
        f"{config.policy} buffers of {config.capacity} samples"
    )
    for col in ("device", "target/s", "rate/s", "fill", "accepted", "dropped", "rejected"):
        table.add_column(col, justify="right")
    if published:
        table.add_column("published", justify="right")
    assert config.rates is not None
    for i, dev in enumerate(_device_ids(config.devices)):
        s = stats.get(dev, {})
        row = [
            dev,
            f"{config.rates[i]:.0f}",
            f"{s.get('rate', 0.0):.1f}",
            str(s.get("fill", 0)),
            str(s.get("accepted", 0)),
            str(s.get("dropped", 0)),
            str(s.get("rejected", 0)),
        ]
        if published:
            row.append(str(published.get(dev, "?")))
        table.add_row(*row)
    return table


def run_stream_demo(config: DemoConfig, console: Console) -> bool:
    """The streaming half alone; True when every published sample arrived exactly once.

    Writes ``<out>/stream-<time>/`` with the buffers, logs and ``summary.json``.
    """
    assert config.rates is not None
    run_id = datetime.now(UTC).strftime("stream-%Y%m%d-%H%M%S")
    run_dir = config.out / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    devices = _device_ids(config.devices)
    paths = {dev: run_dir / "buffers" / f"{dev}.sqlite" for dev in devices}
    stores: dict[str, BufferStore] = {}
    published: dict[str, int] = {}
    ingest_rc: dict[str, int | None] = {}
    start = time.monotonic()
    secrets = make_run_secrets(run_dir / "secrets", devices) if config.secure else None
    _write_shards(config, run_dir)
    with _broker(config, console, secrets) as streams, ProcessGroup() as group:
        _start_ingest(group, config, streams, paths, run_dir)
        pubs = {
            dev: _start_publisher(group, config, streams, i, dev, run_dir, config.duration)
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
                stats = _read_stats(paths, stores)
                elapsed = time.monotonic() - start
                if config.live:
                    live.update(_table(config, stats, {}, elapsed, "streaming"))
                elif elapsed - last_line >= 5.0:
                    console.print(_table(config, stats, {}, elapsed, "streaming"))
                    last_line = elapsed
                time.sleep(0.5)
        for dev, proc in pubs.items():
            out, _ = proc.communicate(timeout=DRAIN_TIMEOUT_S)
            report = _last_json(out.decode(errors="replace"))
            published[dev] = int(report["samples"]) if report else -1
            group.procs.pop(f"publish-{dev}", None)
        _wait_drained(paths, stores, published, DRAIN_TIMEOUT_S, _arrived_counter(config))
        for dev in devices:
            ingest_rc[dev] = group.stop(f"ingest-{dev}")
    stats = _read_stats(paths, stores)
    for store in stores.values():
        store.close()
    elapsed = time.monotonic() - start
    console.print(_table(config, stats, published, elapsed, "final"))
    console.print("rate/s is the ingest daemon's EWMA of arrivals (time constant 5 s)")
    arrived = _arrived_counter(config)
    exact = {dev: stats.get(dev, {}).get(arrived) == published[dev] for dev in devices}
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


def _start_publisher(
    group: ProcessGroup,
    config: DemoConfig,
    streams: _Streams,
    index: int,
    dev: str,
    run_dir: Path,
    duration: float,
) -> subprocess.Popen[bytes]:
    """``fedstream publish`` for one device; its JSON report comes on stdout."""
    assert config.rates is not None
    connect, env = streams.client_args(dev)
    return group.start(
        f"publish-{dev}",
        fedstream_command(
            "publish",
            *connect,
            "--device-id",
            dev,
            "--rate",
            str(config.rates[index]),
            "--duration",
            str(duration),
            "--seed",
            str(index),
            "--json",
            *_source_args(config, run_dir, dev),
            *_skew_args(config, index),
        ),
        log_path=run_dir / "logs" / f"publish-{dev}.log",
        stdout_pipe=True,
        env=env,
    )


def _start_ingest(
    group: ProcessGroup,
    config: DemoConfig,
    streams: _Streams,
    paths: dict[str, Path],
    run_dir: Path,
) -> None:
    """One ``fedstream ingest`` per device; returns once every buffer file exists."""
    for dev, path in paths.items():
        connect, env = streams.client_args(dev)
        group.start(
            f"ingest-{dev}",
            fedstream_command(
                "ingest",
                *connect,
                "--device-id",
                dev,
                "--buffer",
                str(path),
                "--policy",
                config.policy,
                "--capacity",
                str(config.capacity),
                "--status-interval",
                "2",
                *_ingest_args(config),
                *(["--inject"] if config.inject else []),
            ),
            log_path=run_dir / "logs" / f"ingest-{dev}.log",
            env=env,
        )
    _wait_for_buffers(paths, group, timeout=30.0)


def _write_shards(config: DemoConfig, run_dir: Path) -> dict[str, int]:
    """Split the ``--source`` recording across the devices, in ``<run>/data/``; return each
    device's count of samples (nothing with the synthetic task).

    A recording of samples is shuffled once (seed :data:`~deploy.constants.DEMO_SEED`) and
    split (``<device>.npz``); a series for forecasting is split in time (``<device>.csv``,
    a stretch of readings each, with the series' channel names: the device's sensor).
    """
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    devices = _device_ids(config.devices)
    if config.test_windows is not None:
        test = config.test_windows
        np.savez(run_dir / "data" / "test.npz", x=test, y=np.zeros(len(test), np.int64))
    if config.series is not None:
        stretches = np.array_split(config.series, config.devices)
        for dev, stretch in zip(devices, stretches, strict=True):
            np.savetxt(
                run_dir / "data" / f"{dev}.csv",
                stretch,
                delimiter=",",
                header=",".join(config.channels),
                comments="",
            )
        return {dev: len(s) - config.window + 1 for dev, s in zip(devices, stretches, strict=True)}
    if config.recording is None:
        return {}
    x, y = config.recording
    order = np.random.default_rng(DEMO_SEED).permutation(len(y))
    parts = dict(zip(devices, np.array_split(order, config.devices), strict=True))
    for dev, part in parts.items():
        np.savez(run_dir / "data" / f"{dev}.npz", x=x[part], y=y[part])
    return {dev: len(part) for dev, part in parts.items()}


def _source_args(config: DemoConfig, run_dir: Path, dev: str) -> list[str]:
    """The publisher's stream: the device's part of the recording (replayed in order, from
    the start again when it ends; a series reading by reading), or the synthetic task."""
    settings = config.settings
    if config.series is not None:
        return ["--source", str(run_dir / "data" / f"{dev}.csv"), "--readings", "--batch", "1"]
    args = ["--shape", settings.sample_shape, "--num-classes", str(settings.num_classes)]
    if config.recording is not None:
        args += ["--source", str(run_dir / "data" / f"{dev}.npz")]
    return [*args, "--batch", str(DEMO_BATCH)]


def _ingest_args(config: DemoConfig) -> list[str]:
    """What the ingest daemon takes: samples of the run's shape, or (forecasting) the
    series' readings, cut into windows of ``--window`` every reading."""
    commit = ["--commit-interval", str(config.commit_interval)]
    if config.series is not None:
        fields = ",".join(config.channels)
        return ["--fields", fields, "--window", str(config.window), "--stride", "1", *commit]
    settings = config.settings
    return ["--shape", settings.sample_shape, "--num-classes", str(settings.num_classes), *commit]


def _skew_args(config: DemoConfig, index: int) -> list[str]:
    """The publisher's non-IID options for device ``index``."""
    if config.labels is not None:
        classes = pick_classes(config.labels, config.settings.num_classes, index=index)
        return ["--classes", ",".join(map(str, classes))]
    if config.dirichlet is not None:
        return ["--dirichlet", str(config.dirichlet)]
    return []


def _passes(records: list[RoundRecord], shards: dict[str, int]) -> dict[str, float]:
    """How many times over each device trained on its part of a ``--source`` recording
    (its own samples taken / the part's size; nothing with the synthetic task)."""
    taken = {
        dev: sum(
            r.devices[dev].num_examples - r.devices[dev].inject_used
            for r in records
            if dev in r.devices
        )
        for dev in shards
    }
    return {dev: round(taken[dev] / n, 2) for dev, n in shards.items()}


def _what_streams(config: DemoConfig) -> str:
    settings = config.settings
    if config.series is not None:
        return (
            f"{config.source} as per-reading JSON ({', '.join(config.channels)}), windows of "
            f"{config.window} readings, label-free"
        )
    what = str(config.source) if config.source else "the synthetic sensor task"
    return f"{what} ({settings.sample_shape.replace(',', 'x')}, {settings.num_classes} classes)"


def _wait_for_buffers(paths: dict[str, Path], group: ProcessGroup, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths.values()):
        dead = [n for n, p in group.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"ingest daemons did not start (exited: {dead}); see the logs")
        time.sleep(0.1)


def _arrived_counter(config: DemoConfig) -> str:
    """The buffer counter a publisher's count is checked against: samples, or the readings
    of a series published reading by reading."""
    return "readings" if config.series is not None else "received"


def _wait_drained(
    paths: dict[str, Path],
    stores: dict[str, BufferStore],
    published: dict[str, int],
    timeout: float,
    counter: str = "received",
) -> None:
    """Wait until each buffer has seen every published sample (the tail is in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = _read_stats(paths, stores)
        if all(stats.get(d, {}).get(counter, -1) >= n for d, n in published.items()):
            return
        time.sleep(0.2)


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(json.JSONDecodeError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                return obj
    return None


APP_DIR = Path(__file__).resolve().parent.parent  # the Flower app: pyproject.toml is here
STATUS_POLL_S = 1.0  # how often the progress table reads metrics.jsonl
# How often the run's status is asked for while rounds come in: each `flwr list` is a Python
# process of about 1 CPU-second, which the devices on a 2-core host would otherwise share.
STATUS_CHECK_S = 10.0
BROKER_OUTAGE_S = 5.0


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
    devices = _device_ids(config.devices)
    paths = {dev: run_dir / "buffers" / f"{dev}.sqlite" for dev in devices}
    start = time.monotonic()
    status: dict[str, Any] = {}
    secrets = make_run_secrets(run_dir / "secrets", devices) if config.secure else None
    shards = _write_shards(config, run_dir)
    with _broker(config, console, secrets) as streams, ProcessGroup() as group:
        _start_ingest(group, config, streams, paths, run_dir)
        for i, dev in enumerate(devices):  # streaming until training ends
            _start_publisher(group, config, streams, i, dev, run_dir, PUBLISH_FOREVER_S)
        flower = FlowerDeployment(group, run_dir / "flwr", secrets=secrets)
        flower.start_superlink()
        if secrets is not None:  # only these SuperNodes may join
            for dev in devices:
                flower.register_supernode(secrets.node_public_key(dev))
        node_configs = {
            dev: NodeConfig(
                dev, str(paths[dev]), slowdown=config.slowdowns[i], threads=1, inject=config.inject
            )
            for i, dev in enumerate(devices)
        }
        for dev, node_config in node_configs.items():
            flower.start_supernode(dev, node_config.to_node_config())
        console.print(
            f"[bold]{config.devices} devices[/bold] (slowdowns {config.slowdowns}, "
            f"streams {config.rates} {'readings' if config.series is not None else 'samples'}/s"
            f" of {_what_streams(config)}): SuperLink on "
            f"127.0.0.1:{flower.port}" + (" (TLS, registered SuperNodes only)" if secrets else "")
        )
        flower.wait_nodes(config.devices)
        settings = _run_settings(config, run_dir)
        flwr_run = flower.submit(APP_DIR, settings.to_run_config())
        console.print(f"flwr run {flwr_run} submitted; training {settings.num_rounds} rounds")
        status, resumed = _follow(flower, flwr_run, config, run_dir, console, node_configs, streams)
        runs = [flwr_run, *resumed]
    wall = time.monotonic() - start
    records = read_metrics(run_dir / "metrics.jsonl")
    passes = _passes(records, shards)
    diverged = _diverged(records, settings)
    ok = status.get("status") == "finished:completed" and len(records) == settings.num_rounds
    export = _final_export(settings) if ok else None
    serve = _infer_command(config, settings) if export is not None else None
    summary = {
        **summarize(records, wall),
        "run_id": runs[-1],
        "runs": runs,  # more than one when the aggregator was killed and the run resumed
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
        "test": str(config.test) if config.test else None,
        "run_config": settings.to_run_config(),
        "source_passes": passes,
        "export": export,
        "infer_command": serve,
        "note": "virtual_s: sum over rounds of the slowest device's compute + wait + transfer",
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if records:
        write_report(records, run_dir / "report.png", f"fedstream demo: {settings.controller}")
        console.print(_progress_table(records, settings.num_rounds, "final"))
    if passes and max(passes.values()) > 1:
        console.print(
            f"the recording was replayed up to {max(passes.values()):.1f} times over: past the "
            "first pass, prequential scores include samples the model already trained on "
            "(the test set's score does not)"
        )
    logs = f"Logs: {run_dir}/logs, {run_dir}/flwr/logs, {run_dir}/serverapp.log"
    if ok:
        last = records[-1]
        test = (
            "" if math.isnan(last.test_accuracy) else f", {last.test_accuracy:.3f} on the test set"
        )
        console.print(
            f"[green]finished[/green]: {len(records)} rounds, {last.metric} {last.accuracy:.3f} "
            f"(prequential, on the devices){test}, {wall:.0f} s wall. Report: "
            f"{run_dir}/report.png, {run_dir}/summary.json, {run_dir}/metrics.jsonl"
        )
        console.print(_breakdown_line(summary["breakdown"]))
        if export is not None:
            console.print(
                f"the final model is version {export['version']} in {export['dir']}; serve it "
                f"on a device's stream with: {serve}",
                soft_wrap=True,
            )
    elif diverged:
        console.print(
            f"[red]the run diverged[/red] ({len(records)} of {settings.num_rounds} rounds): "
            f"{_divergence_line(records, settings)}. {logs}"
        )
    else:
        why = status.get("status-details") or status.get("status") or "no status"
        console.print(
            f"[red]the run did not finish[/red] ({len(records)} of {settings.num_rounds} rounds): "
            f"{why}. {logs}"
        )
    return ok


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


def _diverged(records: list[RoundRecord], settings: RunSettings) -> bool:
    """Whether the run ended because training diverged: its last round made
    ``max-diverged-rounds`` in a row."""
    limit = settings.max_diverged_rounds
    return bool(records) and limit > 0 and records[-1].diverged_rounds >= limit


def _divergence_line(records: list[RoundRecord], settings: RunSettings) -> str:
    """Why a diverged run ended, and what to change, in one line."""
    last = records[-1]
    return (
        f"{last.divergence()} in round {last.round}, {last.diverged_rounds} rounds in a row "
        f"(max-diverged-rounds = {settings.max_diverged_rounds}): "
        f"{divergence_hint(settings.lr)} (--run-config lr=...)"
    )


def _final_export(settings: RunSettings) -> dict[str, Any] | None:
    """The newest model version in ``export-dir`` (its folder and number), or None."""
    from edge_client.wire.artifact import latest_version  # torch: only once a run ended

    version = latest_version(settings.export_dir) if settings.export_dir else None
    if version is None:
        return None
    return {"dir": settings.export_dir, "version": version.version, "path": str(version.path)}


def _infer_command(config: DemoConfig, settings: RunSettings) -> str:
    """The ``fedstream infer`` command that serves the exported model on ``dev-0``'s stream,
    as the demo's devices publish it: sample frames, or a series' per-reading JSON cut into
    the run's windows (the demo's own broker is gone by now: the command names the one the
    demo was given, else ``fedstream broker``'s default address)."""
    broker = config.broker or f"mqtt://127.0.0.1:{DEFAULT_MQTT_PORT}"
    dev = _device_ids(config.devices)[0]
    args = ["--broker", broker, "--device-id", dev, "--model", settings.export_dir]
    if config.series is not None:
        args += ["--fields", ",".join(config.channels), "--window", str(config.window)]
        args += ["--stride", "1"]
    if settings.preprocess == "standardize":  # the device's statistics are in its buffer
        args += ["--buffer", str(Path(settings.out_dir) / "buffers" / f"{dev}.sqlite")]
    return shlex.join(["fedstream", "infer", *args])


def _breakdown_line(breakdown: dict[str, Any]) -> str:
    """Where the rounds' wall time went, in one line (the largest parts first)."""
    if not breakdown:
        return "no round recorded where its wall time went"
    shares = sorted(breakdown["shares"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{p} {100 * v:.0f} %" for p, v in shares if v >= 0.01)
    return (
        f"the devices trained for {100 * breakdown['training_share']:.0f} % of the rounds' wall "
        f"time (median round {breakdown['round_wall_s']:.1f} s; along the slowest device: "
        f"{parts})"
    )


def _follow(
    flower: FlowerDeployment,
    run_id: str,
    config: DemoConfig,
    run_dir: Path,
    console: Console,
    node_configs: dict[str, NodeConfig],
    streams: _Streams,
) -> tuple[dict[str, Any], list[str]]:
    """Show progress until the run ends (or stalls past every round's timeout).

    Injects the faults asked for: SuperNodes killed and restarted, the broker killed and
    started again ``BROKER_OUTAGE_S`` later (training goes on from the buffers), and the aggregator
    (SuperLink with its ServerApp) killed, started again, and the run resumed from its last
    checkpoint as ``fedstream resume`` would. Returns the last run's status and the run ids
    submitted after the first.
    """
    rounds = config.settings.num_rounds
    deadline = time.monotonic() + 120.0 + rounds * (config.settings.round_timeout + 30.0)
    status: dict[str, Any] = {}
    resumed: list[str] = []
    with Live(console=console, refresh_per_second=2, transient=not config.live) as live:
        shown = -1
        doomed = dict(config.kill)
        revived = dict(config.restart)
        aggregator_fault = config.kill_aggregator
        broker_fault = config.kill_broker
        broker_back_at: float | None = None
        next_check = 0.0
        while time.monotonic() < deadline:
            records = read_metrics(run_dir / "metrics.jsonl")
            if time.monotonic() >= next_check or len(records) >= rounds:
                status = flower.status(run_id)
                next_check = time.monotonic() + STATUS_CHECK_S
            if streams.mosquitto is not None:
                if broker_fault is not None and len(records) >= broker_fault:
                    streams.mosquitto.kill()
                    console.print(
                        f"[yellow]killed the broker (SIGKILL) after round {broker_fault}[/]"
                    )
                    broker_fault, broker_back_at = None, time.monotonic() + BROKER_OUTAGE_S
                if broker_back_at is not None and time.monotonic() >= broker_back_at:
                    streams.mosquitto.restart()
                    console.print(f"[yellow]restarted the broker ({BROKER_OUTAGE_S:.0f} s down)[/]")
                    broker_back_at = None
            if aggregator_fault is not None and len(records) >= aggregator_fault:
                run_id = _kill_and_resume(flower, config, run_dir, console, len(records))
                resumed.append(run_id)
                aggregator_fault = None
                continue
            for dev, after in list(doomed.items()):
                if len(records) >= after:  # fault injection: the device dies (SIGKILL)
                    flower.kill_supernode(dev)
                    console.print(f"[yellow]killed {dev}'s SuperNode after round {after}[/yellow]")
                    del doomed[dev]
            for dev, after in list(revived.items()):
                if dev not in doomed and len(records) >= after:  # the device comes back
                    flower.start_supernode(dev, node_configs[dev].to_node_config())
                    console.print(f"[yellow]restarted {dev}'s SuperNode after round {after}[/]")
                    del revived[dev]
            if len(records) != shown:
                shown = len(records)
                table = _progress_table(records, rounds, str(status.get("status", "")))
                if config.live:
                    live.update(table)
                elif records:
                    console.print(table)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(STATUS_POLL_S)
    (run_dir / "serverapp.log").write_text(flower.logs(run_id))
    return status, resumed


def _kill_and_resume(
    flower: FlowerDeployment, config: DemoConfig, run_dir: Path, console: Console, done: int
) -> str:
    """The aggregator host dies mid-round and comes back; the run resumes. New run id."""
    flower.kill_superlink()
    console.print(
        f"[yellow]killed the aggregator (SuperLink + ServerApp, SIGKILL) after round {done}[/]"
    )
    flower.start_superlink()  # same port and state database, as systemd would restart it
    flower.wait_nodes(config.devices)  # the SuperNodes reconnect on their own
    run_id, last, total = flower.resume(run_dir / "checkpoint", APP_DIR)
    console.print(
        f"[yellow]resumed from the checkpoint of round {last} as run {run_id} "
        f"(rounds {last + 1}..{total})[/]"
    )
    return run_id


def _progress_table(records: list[RoundRecord], rounds: int, state: str) -> Table:
    last = records[-1] if records else None
    asynchronous = last is not None and last.mode == "async"
    title = f"{'version' if asynchronous else 'round'} {len(records)}/{rounds}"
    if last is not None:
        title += f", {last.metric} {last.accuracy:.3f} (prequential)"
        if not math.isnan(last.test_accuracy):
            title += f", {last.test_accuracy:.3f} (test set)"
        title += f", sum b {last.sum_b}"
        if asynchronous:
            title += f", {len(last.updates)} updates, {last.in_flight} in flight"
    table = Table(title=f"{title} ({state})")
    columns = ["device", "planned b", "batch", "compute s", "wait s", "rate/s", "fill"]
    if asynchronous:
        columns += ["updates", "staleness"]
    for col in columns:
        table.add_column(col, justify="right")
    if last is not None:
        for dev, m in sorted(last.devices.items()):
            row = [
                dev,
                str(last.planned.get(dev, "-")),
                str(m.batch_size),
                f"{m.compute_s:.2f}",
                f"{m.wait_s:.2f}",
                f"{m.stream_rate:.0f}",
                str(m.buffer_fill),
            ]
            if asynchronous:  # this version's updates from the device, and how old each was
                stale = [str(u.staleness) for u in last.updates if u.device == dev]
                row += [str(len(stale)), ",".join(stale) or "-"]
            table.add_row(*row)
    return table
