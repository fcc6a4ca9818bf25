"""The demo's streaming half: its broker, one publisher and one ingest daemon per device (as
``fedstream publish`` and ``fedstream ingest`` processes), the recording split across them,
and their buffers read back."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from deploy.brokers import (
    BROKER_CONFIG_DIR,
    EmbeddedBroker,
    MosquittoBroker,
)
from deploy.constants import (
    DEMO_BATCH,
    DEMO_INGEST_START_S,
    DEMO_SEED,
)
from deploy.demo_config import DemoConfig, device_ids
from deploy.local import ProcessGroup, fedstream_command
from deploy.secure import RunSecrets
from edge_client.emulation.reading_styles import default_topic, ingest_options
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.buffer import BufferStore, BufferStoreError
from edge_client.runtime.constants import INGEST_SUBSCRIBED_LOG

__all__ = [
    "Streams",
    "arrived_counter",
    "demo_broker",
    "ingest_args",
    "last_json",
    "per_reading",
    "read_stats",
    "skew_args",
    "source_args",
    "start_ingest",
    "start_publisher",
    "stream_table",
    "wait_drained",
    "wait_for_ingest",
    "write_shards",
]


@dataclass
class Streams:
    """Where the demo's MQTT clients connect, and as whom."""

    url: str
    secrets: RunSecrets | None = None
    mosquitto: MosquittoBroker | None = None  # the demo's own, for broker fault injection
    mqtt_version: str | None = None  # None: the clients' default (MQTT 5, or the environment's)

    def client_args(self, dev: str) -> tuple[list[str], dict[str, str]]:
        """Options and environment of ``fedstream publish|ingest`` for device ``dev``."""
        args = ["--broker", self.url]
        if self.mqtt_version is not None:
            args += ["--mqtt-version", self.mqtt_version]
        if self.secrets is None:
            return args, {}
        return (
            [*args, "--username", dev, "--cafile", str(self.secrets.ca)],
            {"FEDSTREAM_MQTT_PASSWORD": self.secrets.password(dev)},  # not on command lines
        )


@contextlib.contextmanager
def demo_broker(
    config: DemoConfig, console: Console, secrets: RunSecrets | None = None
) -> Iterator[Streams]:
    if config.broker is not None:
        yield Streams(config.broker)
        return
    if secrets is not None:  # the production config: TLS listener first, then plain + auth
        with MosquittoBroker(BROKER_CONFIG_DIR / "mosquitto-prod.conf", secrets.root) as prod:
            url = f"mqtts://127.0.0.1:{prod.port}"
            console.print(
                f"[bold]broker[/bold]: Mosquitto on {url} (TLS, a password and an ACL per device)"
            )
            yield Streams(url, secrets, prod)
        return
    if config.mosquitto:  # persistence on, as in production
        with MosquittoBroker(persist=True) as mosquitto:
            console.print(f"[bold]broker[/bold]: Mosquitto on {mosquitto.url}")
            yield Streams(mosquitto.url, mosquitto=mosquitto)
        return
    with EmbeddedBroker() as embedded:
        console.print(f"[bold]broker[/bold]: embedded broker (iotcore) on {embedded.url}")
        yield Streams(embedded.url, mqtt_version=embedded.mqtt_version)


def read_stats(paths: dict[str, Path], stores: dict[str, BufferStore]) -> dict[str, dict[str, Any]]:
    stats: dict[str, dict[str, Any]] = {}
    for dev, path in paths.items():
        if dev not in stores:
            try:
                stores[dev] = BufferStore(path)
            except BufferStoreError:
                continue  # the daemon has not created it yet
        stats[dev] = stores[dev].stats()
    return stats


def stream_table(
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
    for i, dev in enumerate(device_ids(config.devices)):
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


def start_publisher(
    group: ProcessGroup,
    config: DemoConfig,
    streams: Streams,
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
            *source_args(config, run_dir, dev),
            *skew_args(config, index),
        ),
        log_path=run_dir / "logs" / f"publish-{dev}.log",
        stdout_pipe=True,
        env=env,
    )


def start_ingest(
    group: ProcessGroup,
    config: DemoConfig,
    streams: Streams,
    paths: dict[str, Path],
    run_dir: Path,
) -> None:
    """One ``fedstream ingest`` per device; returns once every daemon has subscribed (so that
    the broker keeps what publishers send from then on)."""
    for index, (dev, path) in enumerate(paths.items()):
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
                *ingest_args(config, dev, index),
                *(["--inject"] if config.inject else []),
            ),
            log_path=run_dir / "logs" / f"ingest-{dev}.log",
            env=env,
        )
    wait_for_ingest(paths, group, run_dir / "logs", timeout=DEMO_INGEST_START_S)


def write_shards(config: DemoConfig, run_dir: Path) -> dict[str, int]:
    """Split the ``--source`` recording across the devices, in ``<run>/data/``; return each
    device's count of samples (nothing with the synthetic task).

    A recording of samples is shuffled once (seed :data:`~deploy.constants.DEMO_SEED`) and
    split (``<device>.npz``), or, partitioned (``--partition-by``, ``--partition``), each
    device gets its part in recorded order; a series for forecasting is split in time
    (``<device>.csv``, a stretch of readings each, with the series' channel names: the
    device's sensor).
    """
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    devices = device_ids(config.devices)
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
    if config.parts is not None:  # a partition: each device's rows, in recorded order
        parts = dict(zip(devices, config.parts, strict=True))
    else:
        order = np.random.default_rng(DEMO_SEED).permutation(len(y))
        parts = dict(zip(devices, np.array_split(order, config.devices), strict=True))
    for dev, part in parts.items():
        np.savez(run_dir / "data" / f"{dev}.npz", x=x[part], y=y[part])
    return {dev: len(part) for dev, part in parts.items()}


def source_args(config: DemoConfig, run_dir: Path, dev: str) -> list[str]:
    """The publisher's stream: the device's part of the recording (replayed in order, from
    the start again when it ends; a series reading by reading), or the synthetic task."""
    settings = config.settings
    if config.series is not None:
        style = [] if config.style == "json" else ["--style", config.style]
        csv = str(run_dir / "data" / f"{dev}.csv")
        return ["--source", csv, "--readings", "--batch", "1", *style]
    args = ["--shape", settings.sample_shape, "--num-classes", str(settings.num_classes)]
    if config.recording is not None:
        args += ["--source", str(run_dir / "data" / f"{dev}.npz")]
    return [*args, "--batch", str(DEMO_BATCH)]


def ingest_args(config: DemoConfig, dev: str, index: int) -> list[str]:
    """What device ``dev``'s ingest daemon takes: samples of the run's shape, or
    (forecasting) the series' readings, cut into windows of ``--window`` every reading: in
    a ``--style``, with the options that read it back (one stream a channel: on a grid at
    the device's rate)."""
    commit = ["--commit-interval", str(config.commit_interval)]
    if config.series is not None:
        windows = ["--window", str(config.window), "--stride", "1", *commit]
        if config.style == "json":
            return ["--fields", ",".join(config.channels), *windows]
        topic = default_topic(config.style, dev)
        assert topic is not None
        rates = config.rates or []  # set by DemoConfig
        grid = ["--rate", str(rates[index])] if per_reading(config) > 1 else []
        return [*ingest_options(config.style, topic, config.channels), *grid, *windows]
    settings = config.settings
    return ["--shape", settings.sample_shape, "--num-classes", str(settings.num_classes), *commit]


def skew_args(config: DemoConfig, index: int) -> list[str]:
    """The publisher's non-IID options for device ``index``."""
    if config.labels is not None:
        classes = pick_classes(config.labels, config.settings.num_classes, index=index)
        return ["--classes", ",".join(map(str, classes))]
    if config.dirichlet is not None:
        return ["--dirichlet", str(config.dirichlet)]
    return []


def wait_for_ingest(
    paths: dict[str, Path], group: ProcessGroup, logs: Path, timeout: float
) -> None:
    """Wait until each device's ingest daemon has made its buffer and the broker has
    acknowledged its subscription (its log says so).

    A buffer file alone is not enough: on a loaded machine a daemon can take seconds from
    creating its buffer to subscribing, and a QoS 1 message published before any session
    subscribed is dropped by the broker.

    Raises
    ------
    RuntimeError
        If a daemon exits or ``timeout`` seconds pass first (the message names the logs).
    """

    def subscribed(dev: str) -> bool:
        log = logs / f"ingest-{dev}.log"
        return log.exists() and INGEST_SUBSCRIBED_LOG in log.read_text(errors="replace")

    deadline = time.monotonic() + timeout
    while not all(p.exists() and subscribed(dev) for dev, p in paths.items()):
        dead = [n for n, p in group.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            waiting = [dev for dev, p in paths.items() if not (p.exists() and subscribed(dev))]
            raise RuntimeError(
                f"ingest daemons {waiting} did not subscribe within {timeout:.0f} s "
                f"(exited: {dead}); see {logs}"
            )
        time.sleep(0.1)


def per_reading(config: DemoConfig) -> int:
    """Readings an ingest daemon counts for each one published: one a channel where each
    channel is a stream of its own (``--style esphome`` or ``sparkplug``)."""
    own_streams = config.style in ("esphome", "sparkplug") and len(config.channels) > 1
    return len(config.channels) if own_streams else 1


def arrived_counter(config: DemoConfig) -> str:
    """The buffer counter a publisher's count is checked against: samples, or the readings
    of a series published reading by reading."""
    return "readings" if config.series is not None else "received"


def wait_drained(
    paths: dict[str, Path],
    stores: dict[str, BufferStore],
    published: dict[str, int],
    timeout: float,
    counter: str = "received",
) -> None:
    """Wait until each buffer has seen every published sample (the tail is in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = read_stats(paths, stores)
        if all(stats.get(d, {}).get(counter, -1) >= n for d, n in published.items()):
            return
        time.sleep(0.2)


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(json.JSONDecodeError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                return obj
    return None
