"""Shared fixtures, and the test tiers.

Tests live in one of three folders, and each folder is a marker (``pytest -m unit``):

- ``unit``: the math and the logic, and the real ServerApp and ClientApp on the in-process
  runner; no processes, no network. The fast tier (under a minute).
- ``integration``: real parts together: an MQTT broker, ``fedstream`` processes, Flower's
  SuperLink and SuperNodes.
- ``faults``: faults injected into real parts (kills, a full disk, hostile input).

A test marked ``mosquitto`` is skipped, with the reason, where Mosquitto is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.inprocess import VirtualDevice
from deploy.local import ProcessGroup
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import encode_frame
from edge_client.wire.run_config import RunSettings

TIERS = ("unit", "integration", "faults")
TESTS = Path(__file__).parent

#: A short in-process run: a few rounds of a few steps on a small global batch.
FAST: dict[str, Any] = {
    "num_rounds": 3,
    "local_steps": 5,
    "global_batch": 64,
    "b_min": 4,
    "b_max": 64,
    "eval_data": "synthetic",  # the built-in task's held-out set: test-accuracy
    "eval_samples": 500,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its folder); skip Mosquitto tests without Mosquitto."""
    have_mosquitto = mosquitto_available()
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.path}: tests go in tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("mosquitto") is not None and not have_mosquitto:
            item.add_marker(
                pytest.mark.skip(reason="mosquitto is not installed (apt-get install -y mosquitto)")
            )


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    """In-process training on one thread: reproducible, and fair on a shared machine."""
    torch.set_num_threads(1)


@pytest.fixture
def fast() -> Callable[..., RunSettings]:
    """Settings of a short in-process run (:data:`FAST`), with field overrides."""

    def make(**overrides: Any) -> RunSettings:
        return RunSettings(**{**FAST, **overrides})

    return make


@pytest.fixture
def fleet() -> Callable[..., list[VirtualDevice]]:
    """Virtual devices ``dev-0``, ``dev-1``, ... one per slowdown given, each with ``kw``."""

    def make(*slowdowns: float, **kw: Any) -> list[VirtualDevice]:
        return [VirtualDevice(f"dev-{i}", slowdown=s, **kw) for i, s in enumerate(slowdowns)]

    return make


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
