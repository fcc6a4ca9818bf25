"""Shared fixtures: a real broker (Mosquitto when installed, else the embedded one)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup, fedstream_command, wait_until
from edge_client.buffer import BufferStore
from edge_client.frames import encode_frame
from edge_client.synthetic import SensorTask

needs_mosquitto = pytest.mark.skipif(
    not mosquitto_available(), reason="mosquitto is not installed (apt-get install -y mosquitto)"
)


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
