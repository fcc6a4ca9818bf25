"""Probes for fault and security checks, shared by the reliability report and the tests: a
plain MQTT client that can be refused, hostile update frames that pass the checksum, and a
small disk that can be filled up."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from deploy.local import wait_until
from edge_client.codec import encode, reseal
from edge_client.mqtt import BrokerURL, connect_async, make_client

__all__ = ["MqttProbe", "fill_disk", "nan_frame", "small_disk"]

BALLAST_CHUNK = 1 << 20


class MqttProbe:
    """A plain paho client for checks: publish raw payloads, collect messages, see refusals."""

    def __init__(self, url: str, client_id: str, **kw: Any) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.connected = False
        self.refused: Any = None
        self.client = make_client(client_id, BrokerURL.parse(url), **kw)
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda _c, _u, m: self.messages.append(m)
        connect_async(self.client, BrokerURL.parse(url))

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.refused = rc
        else:
            self.connected = True

    def wait_connected(self, timeout: float = 10.0) -> bool:
        """True once connected; False if refused or still trying after ``timeout`` s."""
        return wait_until(lambda: self.connected, timeout)

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        """Publish and wait (up to 10 s) until the broker has it."""
        self.client.publish(topic, payload, qos=qos).wait_for_publish(10)

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
