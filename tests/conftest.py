"""Shared fixtures: a real broker (Mosquitto when installed, else the embedded one)."""

from __future__ import annotations

import json
import math
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
import zstandard

from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup, fedstream_command
from edge_client.buffer import BufferStore
from edge_client.codec import encode, seal
from edge_client.constants import CODEC_MODES
from edge_client.frames import encode_frame
from edge_client.mqtt import BrokerURL, connect_async, make_client
from edge_client.synthetic import SensorTask

needs_mosquitto = pytest.mark.skipif(
    not mosquitto_available(), reason="mosquitto is not installed (apt-get install -y mosquitto)"
)


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``pred`` until true or ``timeout`` seconds (bounded loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker | MosquittoBroker]:
    """A broker on a free 127.0.0.1 port: Mosquitto's dev config if installed, else iotcore.

    ``FEDSTREAM_TEST_BROKER=embedded`` forces the embedded broker.
    """
    choice = os.environ.get("FEDSTREAM_TEST_BROKER", "auto")
    use_mosquitto = choice == "mosquitto" or (choice == "auto" and mosquitto_available())
    b: EmbeddedBroker | MosquittoBroker = MosquittoBroker() if use_mosquitto else EmbeddedBroker()
    with b:
        yield b


@pytest.fixture
def procs() -> Iterator[ProcessGroup]:
    """Children a test starts; every one is stopped by pid at the end."""
    with ProcessGroup(grace=10.0) as group:
        yield group


@pytest.fixture
def frames() -> Callable[..., bytes]:
    """Make a valid binary frame of ``n`` synthetic samples."""
    task = SensorTask()
    rng = np.random.default_rng(0)

    def make(n: int = 4, publisher: str = "p", seq: int = 0, **kw: Any) -> bytes:
        x, y = task.sample(n, rng)
        return encode_frame(x, y, np.full(n, 1.7e9), publisher=publisher, seq=seq, **kw)

    return make


def start_ingest(
    procs: ProcessGroup,
    url: str,
    buffer: Path,
    device_id: str = "dev-a",
    *extra: str,
    name: str = "ingest",
) -> None:
    """Start ``fedstream ingest`` as a real child process and wait until it made the buffer."""
    procs.start(
        name,
        fedstream_command(
            "ingest",
            "--broker",
            url,
            "--device-id",
            device_id,
            "--buffer",
            str(buffer),
            "--status-interval",
            "0.5",
            *extra,
        ),
        log_path=buffer.with_suffix(".log"),
    )
    assert wait_until(buffer.exists, 20), (buffer.with_suffix(".log")).read_text()


def stats(buffer: Path) -> dict[str, Any]:
    """The buffer's counters as ``fedstream status --json`` reports them."""
    with BufferStore(buffer) as store:
        return store.stats()


class RawClient:
    """A plain paho client for tests: publish raw payloads, collect messages."""

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
        return wait_until(lambda: self.connected, timeout)

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos=qos).wait_for_publish(10)

    def subscribe(self, topic: str) -> None:
        assert self.wait_connected(), f"could not connect: {self.refused}"
        self.client.subscribe(topic, qos=1)

    def last_json(self) -> dict[str, Any]:
        return json.loads(self.messages[-1].payload) if self.messages else {}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def reseal(frame: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    """Re-frame an update frame after editing its raw body (valid prefix and CRC)."""
    mode = CODEC_MODES[frame[5]]
    count = int.from_bytes(frame[6:8], "little")
    raw = zstandard.ZstdDecompressor().decompress(frame[20:])
    return seal(mode, count, edit(raw))


def nan_frame(tensors: dict[str, np.ndarray]) -> bytes:
    """A well-formed ``none`` frame whose first value is NaN."""
    frame = encode(tensors, "none")
    first = sum(len(n.encode()) + 1 + 2 + 4 * t.ndim + 5 for n, t in tensors.items())
    return reseal(frame, lambda raw: raw[:first] + struct.pack("<f", math.nan) + raw[first + 4 :])
