"""Shared fixtures: a real broker (Mosquitto when installed, else the embedded one)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.local import ProcessGroup
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
