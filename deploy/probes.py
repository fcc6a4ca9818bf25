"""Probes for fault and security checks, shared by the reliability report
(``fedstream bench reliability``) and the tests: a plain MQTT client that can be refused,
hostile update frames that pass the checksum, a small disk that can be filled up, the real
``fedstream ingest`` / ``publish`` processes with their buffer's counters and report, and a
secured SuperLink that a SuperNode with an unregistered key tries to join."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from prometheus_client.parser import text_string_to_metric_families

from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.secure import RunSecrets, make_node_key
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import INGEST_SUBSCRIBED_LOG
from edge_client.runtime.mqtt import BrokerOptions, connect_async, make_client
from edge_client.runtime.node_config import NodeConfig
from edge_client.wire.codec import encode, reseal

__all__ = [
    "DISK_FULL_S",
    "SMALL_DISK_MB",
    "MetricSamples",
    "MqttProbe",
    "buffer_stats",
    "fill_disk",
    "nan_frame",
    "parse_metrics",
    "publish_report",
    "scrape_metrics",
    "small_disk",
    "start_ingest",
    "start_publisher",
    "supernode_admission",
]

BALLAST_CHUNK = 1 << 20
SMALL_DISK_MB = 160  # a buffer's WAL grows to ~64 MB (1000 pages of 64 KB) before a checkpoint
DISK_FULL_S = 3.0  # how long the disk-full fault keeps the disk full
REFUSED_WAIT_S = 60.0  # how long an unregistered SuperNode gets to give up


#: Prometheus samples by (name, sorted label pairs).
MetricSamples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> MetricSamples:
    """Prometheus exposition text, read with prometheus_client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_metrics(port: int, timeout: float = 10.0) -> MetricSamples:
    """``http://127.0.0.1:port/metrics``, parsed.

    Raises
    ------
    OSError
        If nothing answers there.
    """
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse_metrics(resp.read().decode())


class MqttProbe:
    """A plain paho client for checks: publish raw payloads, collect messages, see refusals
    (``kw``: the credentials, TLS files and MQTT version of
    :class:`~edge_client.runtime.mqtt.BrokerOptions`, and ``session_expiry`` or ``manual_ack``
    of :func:`~edge_client.runtime.mqtt.make_client`)."""

    def __init__(self, url: str, client_id: str, **kw: Any) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.connected = False
        self.refused: Any = None
        session = {k: kw.pop(k) for k in ("session_expiry", "manual_ack") if k in kw}
        options = BrokerOptions.of(url, **kw)
        self.client = make_client(client_id, options, **session)
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda _c, _u, m: self.messages.append(m)
        connect_async(self.client, options)

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.refused = rc
        else:
            self.connected = True

    def wait_connected(self, timeout: float = 10.0) -> bool:
        """True once connected; False if refused or still trying after ``timeout`` s."""
        return wait_until(lambda: self.connected, timeout)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Publish and wait (up to 10 s) until the broker has it."""
        self.client.publish(topic, payload, qos=qos, retain=retain).wait_for_publish(10)

    def subscribe(self, topic: str) -> None:
        """Subscribe at QoS 1; received messages collect in :attr:`messages`.

        Raises
        ------
        RuntimeError
            If the probe cannot connect.
        """
        if not self.wait_connected():
            raise RuntimeError(f"could not connect: {self.refused}")
        self.client.subscribe(topic, qos=1)

    def last_json(self) -> dict[str, Any]:
        """The last message received, as JSON ({} before any)."""
        return json.loads(self.messages[-1].payload) if self.messages else {}

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self.client.disconnect()
        self.client.loop_stop()


def nan_frame(tensors: dict[str, np.ndarray]) -> bytes:
    """A well-formed ``none`` frame whose first value is NaN."""
    frame = encode(tensors, "none")
    first = sum(len(n.encode()) + 1 + 2 + 4 * t.ndim + 5 for n, t in tensors.items())
    return reseal(frame, lambda raw: raw[:first] + struct.pack("<f", math.nan) + raw[first + 4 :])


@contextlib.contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted at ``where/disk`` for the block (root only).

    Raises
    ------
    OSError
        If it cannot be mounted (not root, no mount permission); the message says why.
    """
    mount = where / "disk"
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"cannot mount a tmpfs at {mount}: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_disk(disk: Path) -> Path:
    """Write a ballast file until ``disk`` is full (ENOSPC); delete it to free the space.

    Raises
    ------
    OSError
        If more than a chunk is still free afterwards.
    """
    ballast = disk / "ballast"
    chunk = b"\0" * BALLAST_CHUNK
    with ballast.open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(chunk)
            fh.flush()
    st = os.statvfs(disk)
    if st.f_bavail * st.f_frsize >= BALLAST_CHUNK:
        raise OSError(f"{disk} did not fill up")
    return ballast


def start_ingest(
    procs: ProcessGroup,
    url: str,
    buffer: Path,
    device_id: str = "dev-a",
    *extra: str,
    name: str = "ingest",
    status_interval: float = 0.5,
    connected: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``fedstream ingest`` as a real child process; return once it made the buffer
    (with ``connected``: once the broker has also acknowledged its subscription, so that it
    holds the daemon's persistent session from then on).

    ``extra`` are more ``fedstream ingest`` options; the log goes next to the buffer.

    Raises
    ------
    RuntimeError
        If the buffer does not appear within 20 s, or with ``connected`` the daemon does not
        connect within 30 s (the message holds the daemon's log).
    """
    log = buffer.with_suffix(".log")
    proc = procs.start(
        name,
        fedstream_command(
            "ingest", "--broker", url, "--device-id", device_id, "--buffer", str(buffer),
            "--status-interval", str(status_interval), *extra,
        ),
        log_path=log,
    )  # fmt: skip
    if not wait_until(buffer.exists, 20):
        raise RuntimeError(f"ingest for {device_id} made no buffer:\n{log.read_text()}")
    # The daemon logs this once the broker acknowledged its subscription (SUBACK).
    if connected and not wait_until(lambda: INGEST_SUBSCRIBED_LOG in log.read_text(), 30):
        raise RuntimeError(f"ingest for {device_id} did not connect:\n{log.read_text()}")
    return proc


def start_publisher(
    procs: ProcessGroup, url: str, device_id: str = "dev-a", *extra: str, name: str = "pub"
) -> subprocess.Popen[bytes]:
    """Start ``fedstream publish --json`` to ``device_id`` as a real child process; read its
    final report with :func:`publish_report`.

    ``extra`` are more ``fedstream publish`` options (rate, count, credentials, ...).
    """
    cmd = fedstream_command("publish", "--broker", url, "--device-id", device_id, "--json", *extra)
    return procs.start(name, cmd, stdout_pipe=True)


def buffer_stats(buffer: Path) -> dict[str, Any]:
    """The buffer's counters as ``fedstream status --json`` reports them."""
    with BufferStore(buffer) as store:
        return store.stats()


def publish_report(proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    """Wait for a ``fedstream publish --json`` process; its final JSON report.

    Raises
    ------
    RuntimeError
        If the publisher failed (the message holds its output).
    """
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"publisher exited {proc.returncode}: {out!r}")
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return report


def supernode_admission(secrets: RunSecrets, tmp: Path) -> dict[str, Any]:
    """A TLS SuperLink with ``--enable-supernode-auth``; dev-a's key registered, and a
    SuperNode with an unregistered key trying to join.

    Returns
    -------
    dict
        ``node-id`` (dev-a's registered id), ``nodes`` (``flwr supernode list``),
        ``intruder-exit`` (None: still running after ``REFUSED_WAIT_S``), ``member-alive``,
        ``superlink-log``.
    """
    stranger = make_node_key(tmp / "stranger" / "dev-b")
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, tmp / "flwr", secrets=secrets)
        flower.start_superlink()
        node_id = flower.register_supernode(secrets.node_public_key("dev-a"))
        member = flower.start_supernode("dev-a", _node(tmp, "dev-a"))
        intruder = flower.start_supernode(
            "dev-b", _node(tmp, "dev-b"), key=stranger.with_suffix("")
        )
        flower.wait_nodes(1, timeout=60)
        wait_until(lambda: intruder.poll() is not None, REFUSED_WAIT_S, interval=0.5)
        nodes = flower.list_nodes()
        alive = member.poll() is None
    return {
        "node-id": node_id,
        "nodes": nodes,
        "intruder-exit": intruder.returncode,
        "member-alive": alive,
        "superlink-log": (tmp / "flwr" / "logs" / "superlink.log").read_text(),
    }


def _node(tmp: Path, device: str) -> dict[str, Any]:
    """A node config for a SuperNode that only has to join (it runs no app)."""
    return NodeConfig(device, str(tmp / f"{device}.sqlite")).to_node_config()
