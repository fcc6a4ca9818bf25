"""Shared fixtures, and the test tiers.

Tests live in one of three folders, and each folder is a marker (``pytest -m unit``):

- ``unit``: the math and the logic, and the real ServerApp and ClientApp on the in-process
  runner; no processes, no network. The fast tier (under a minute).
- ``integration``: real parts together: an MQTT broker, ``fedstream`` processes, Flower's
  SuperLink and SuperNodes.
- ``faults``: faults injected into real parts (kills, a full disk, hostile input).

A test marked ``mosquitto`` is skipped, with the reason, where Mosquitto is not installed.

Nothing a test starts outlives it: pytest becomes the subreaper of every process the suite
starts (Linux), so that what a killed command leaves behind stays findable, and after each test
whatever it started and left running is stopped (SIGTERM, then SIGKILL) and reported.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from deploy.brokers import EmbeddedBroker, MosquittoBroker, mosquitto_available
from deploy.inprocess import VirtualDevice
from deploy.local import ProcessGroup, descendants, pids, proc_stat, wait_until
from edge_client.runtime.constants import MQTT_VERSION_ENV
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


#: Seconds a test's leftover processes get to end by themselves before they are stopped.
LEFTOVER_GRACE_S = 3.0
#: Tests whose stated timeout is at least this many seconds are the suite's long ones (each
#: one to six minutes): they are spread among pytest-xdist's workers first (see below).
LONG_TEST_TIMEOUT_S = 300.0
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
#: Processes pytest's own interpreter keeps for its lifetime, whichever test started them.
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class LeftoverProcessWarning(UserWarning):
    """A test left processes running (they were stopped)."""


def pytest_configure(config: pytest.Config) -> None:
    """Adopt the orphans of the processes the suite starts (a command killed while its
    children run), so that the leftover check below finds them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    workerinput = getattr(config, "workerinput", None)  # set in a pytest-xdist worker
    if workerinput is not None and workerinput["workercount"] > 1:
        config.pluginmanager.register(_LongTestsSpread(workerinput["workercount"]))


def _reap(me: int, keep: set[int]) -> None:
    """Collect the exit status of this process's ended children but those in ``keep``
    (adopted orphans: no Popen waits for them)."""
    for pid in pids():
        stat = proc_stat(pid)
        if stat is not None and stat.state == "Z" and stat.ppid == me and pid not in keep:
            with contextlib.suppress(ChildProcessError):  # collected meanwhile
                os.waitpid(pid, os.WNOHANG)


@pytest.fixture(autouse=True)
def _nothing_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, stop and report every process it started that still runs."""
    me = os.getpid()
    before = {pid for pid, _ in descendants(me)}
    yield

    def leftover() -> set[int]:
        _reap(me, before)
        new = {pid for pid, _ in descendants(me) if pid not in before}
        return {pid for pid in new if not any(h in _cmdline(pid) for h in INTERPRETER_HELPERS)}

    if wait_until(lambda: not leftover(), LEFTOVER_GRACE_S, interval=0.2):
        return
    left = leftover()
    names = {pid: _cmdline(pid) for pid in left}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftover():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if wait_until(lambda: not leftover(), LEFTOVER_GRACE_S, interval=0.2):
            break
    warnings.warn(
        LeftoverProcessWarning(
            f"{request.node.nodeid} left {len(names)} processes running (now stopped): "
            + "; ".join(f"{pid} {cmd}" for pid, cmd in sorted(names.items()))
        ),
        stacklevel=1,
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


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


class _LongTestsSpread:
    """Orders a pytest-xdist worker's tests (:func:`_spread_long_tests`) once ``-m`` and
    ``-k`` have deselected theirs (hence last): xdist splits what is left."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        _spread_long_tests(items, self.workers)


def _timeout_s(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker is not None and marker.args else 0.0


def _spread_long_tests(items: list[pytest.Item], workers: int) -> None:
    """Order ``items`` so that pytest-xdist's workers finish together.

    Its ``worksteal`` scheduler (the process tiers', ``dev/test.sh``) first hands each worker
    a contiguous share of the list (the k-th of ``workers`` near-equal slices), then moves
    tests from the end of a busy worker's queue to an idle one; a long test left near the end
    makes one worker run minutes alone. (``load`` takes from the front: long ones first suit
    it too.)
    So the long tests (a timeout of :data:`LONG_TEST_TIMEOUT_S` or more; the timeout stands in
    for the duration) go to the fronts of the shares, longest first, each to the share with
    the least so far, and the rest follow in their collected order. Every worker computes the
    same order (xdist checks that their collections agree).
    """
    sizes = [len(items) // workers + (k < len(items) % workers) for k in range(workers)]
    sizes.reverse()  # xdist's first shares are the floors: len // workers, then the rest
    long = [i for i in items if _timeout_s(i) >= LONG_TEST_TIMEOUT_S]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for item in sorted(long, key=_timeout_s, reverse=True):  # ties keep their order
        k = min((k for k in range(workers) if len(shares[k]) < sizes[k]), key=load.__getitem__)
        shares[k].append(item)
        load[k] += _timeout_s(item)
    rest = iter([i for i in items if _timeout_s(i) < LONG_TEST_TIMEOUT_S])
    for k in range(workers):
        shares[k].extend(itertools.islice(rest, sizes[k] - len(shares[k])))
    items[:] = [item for share in shares for item in share]


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
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedBroker | MosquittoBroker]:
    """A broker on a free 127.0.0.1 port: Mosquitto's dev config if installed, else iotcore.

    ``FEDSTREAM_TEST_BROKER=embedded`` forces the embedded broker; it speaks MQTT 3.1.1 only,
    so the test's clients (in process and the commands it starts) are told so through
    ``FEDSTREAM_MQTT_VERSION``, as a user of that broker would.
    """
    choice = os.environ.get("FEDSTREAM_TEST_BROKER", "auto")
    use_mosquitto = choice == "mosquitto" or (choice == "auto" and mosquitto_available())
    b: EmbeddedBroker | MosquittoBroker = MosquittoBroker() if use_mosquitto else EmbeddedBroker()
    monkeypatch.setenv(MQTT_VERSION_ENV, b.mqtt_version)
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
