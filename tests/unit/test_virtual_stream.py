"""The virtual clock's streams: arrivals are a function of rate and time, counted once."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.round_log import rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.emulation.lazy_buffer import StreamSamples
from edge_client.emulation.replay import replay_into
from edge_client.emulation.sources import SyntheticSource
from edge_client.emulation.virtual_stream import VirtualStream, arrived
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import POLICY_PERSISTENCE, POLICY_TRUNCATION
from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE
from edge_client.task.synthetic import SensorTask
from edge_client.wire.records import RoundPlan
from edge_client.wire.run_config import RunSettings
from tests.helpers import Fast


def step_time(b: int) -> float:
    return 0.002 + 1e-4 * b


def _source(seed: int = 0) -> SyntheticSource:
    task = SensorTask(DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)
    probs = np.full(DEFAULT_NUM_CLASSES, 1 / DEFAULT_NUM_CLASSES)
    return SyntheticSource(task, np.random.default_rng(seed), probs)


class CountingSource:
    """A source that records how many samples each draw asked for."""

    def __init__(self, inner: SyntheticSource) -> None:
        self.inner, self.shape, self.drawn = inner, inner.shape, list[int]()

    def next(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.drawn.append(n)
        return self.inner.next(n)


def _plan(batch: int, steps: int, policy: str = "wait", deadline: float = 1e6) -> RoundPlan:
    return RoundPlan(
        server_round=1,
        batch_size=batch,
        local_steps=steps,
        lr=0.05,
        wait_policy=policy,
        deadline_s=deadline,
    )


def _streaming(fast: Fast, rounds: int, batch: int, **kw: Any) -> RunSettings:
    """``rounds`` rounds of 10 steps at a global batch of ``batch`` (also b-max), a short
    evaluation and rounds bounded at 60 s; ``kw``: further settings."""
    streaming = {"local_steps": 10, "eval_samples": 100, "round_timeout": 60.0}
    return fast(**streaming, num_rounds=rounds, global_batch=batch, b_max=batch, **kw)


def test_arrived_is_rate_times_elapsed_to_the_sample() -> None:
    # Prepare / Execute / Assert: whole samples only, a float product's last bit forgiven.
    assert arrived(10.0, 0.3) == 3  # 10 * 0.3 is 2.9999999999999996 in floats
    assert arrived(10.0, 0.29) == 2
    assert arrived(7.5, 2.0, initial=4) == 19
    assert arrived(100.0, -1.0, initial=5) == 5


def test_advancing_twice_to_the_same_time_adds_nothing(tmp_path: Path) -> None:
    # Prepare
    with BufferStore(tmp_path / "b.sqlite", shape=DEFAULT_SHAPE) as store:
        stream = VirtualStream(store, _source(), rate=10.0, initial=5)
        # Execute
        first = stream.advance_to(3.0)
        again = stream.advance_to(3.0)
        earlier = stream.advance_to(1.0)
        # Assert
        assert (first, again, earlier) == (30, 0, 0)
        assert store.fill == stream.arrived == 35


def test_a_rate_change_keeps_the_fraction_in_flight(tmp_path: Path) -> None:
    # Prepare: 2.5 samples/s for 1 s (2 delivered, half a sample in flight), then 1.5/s.
    with BufferStore(tmp_path / "b.sqlite", shape=DEFAULT_SHAPE) as store:
        stream = VirtualStream(store, _source(), rate=2.5)
        # Execute
        stream.advance_to(1.0)
        stream.set_rate(1.5, at=1.0)
        stream.advance_to(2.0)
        # Assert: 2.5 + 1.5 = 4 samples, not floor(2.5) + floor(1.5) = 3.
        assert stream.arrived == 4


def test_wait_for_waits_exactly_for_the_deficit(tmp_path: Path) -> None:
    # Prepare: 20 samples/s, 10 buffered, a plan that needs 8 x 5 = 40.
    with BufferStore(tmp_path / "b.sqlite", shape=DEFAULT_SHAPE) as store:
        stream = VirtualStream(store, _source(), rate=20.0, initial=10)
        # Execute
        waited = stream.wait_for(_plan(8, 5), at=0.0)
        # Assert
        assert waited == pytest.approx(1.5)
        assert store.fill == 40


def test_wait_for_a_plan_the_buffer_cannot_hold_runs_to_the_deadline(tmp_path: Path) -> None:
    # Prepare: a 30-sample buffer and a plan that needs 40.
    path = tmp_path / "b.sqlite"
    with BufferStore(path, shape=DEFAULT_SHAPE, policy=POLICY_PERSISTENCE, capacity=30) as store:
        stream = VirtualStream(store, _source(), rate=20.0)
        # Execute
        waited = stream.wait_for(_plan(8, 5, deadline=4.0), at=0.0)
        # Assert: 80 arrived in 4 s; the buffer kept 30 and counted 50 dropped.
        assert waited == 4.0
        stats = store.stats()
        assert (stream.arrived, stats["received"], stats["accepted"]) == (80, 80, 30)
        assert stats["dropped"] == 50


def test_a_full_buffer_does_not_generate_what_its_policy_drops(tmp_path: Path) -> None:
    # Prepare: a truncation buffer of 100 and a stream that delivers a million.
    with BufferStore(tmp_path / "b.sqlite", shape=DEFAULT_SHAPE, capacity=100) as store:
        source = CountingSource(_source())
        stream = VirtualStream(store, source, rate=1e5)
        # Execute
        stream.advance_to(10.0)
        # Assert
        assert stream.arrived == 10**6
        assert source.drawn == [100]
        stats = store.stats()
        assert (stats["received"], stats["dropped"], stats["fill"]) == (10**6, 10**6 - 100, 100)


@pytest.mark.parametrize("policy", [POLICY_TRUNCATION, POLICY_PERSISTENCE])
@pytest.mark.parametrize("wait_policy", ["wait", "adapt"])
def test_arrivals_over_a_run_equal_rate_times_virtual_time(
    tmp_path: Path, fast: Fast, policy: str, wait_policy: str
) -> None:
    # Prepare: the case (10 samples/s, b*K = 100 under `wait`), a fast stream, a
    # stream that outruns its small buffer, and one that starts with a backlog.
    devices = [
        VirtualDevice("slow", rate=10.0, initial=0, policy=policy),
        VirtualDevice("fast", rate=350.0, initial=0, policy=policy),
        VirtualDevice("small", rate=90.0, initial=0, policy=policy, capacity=120),
        VirtualDevice("backlog", rate=25.0, initial=333, policy=policy),
    ]
    settings = _streaming(fast, 4, 40, b_min=1, controller="fixed", wait_policy=wait_policy)
    grid = InProcessGrid(devices, tmp_path / "buffers", settings, step_time=step_time)
    # Execute
    run_rounds(grid, settings)
    # Assert: every device's stream delivered rate x elapsed virtual time, to the sample, and
    # its buffer accounts for each of them (stored and then held, taken or evicted, or dropped).
    assert grid.clock == pytest.approx(sum(grid.round_times))
    for node, dev in grid.devices.items():
        stream, stats = grid.streams[node], grid.stores[node].stats()
        assert stream.arrived == arrived(dev.rate, grid.clock, dev.initial), dev.device_id
        assert stats["received"] == stream.arrived
        assert stats["accepted"] + stats["dropped"] >= stats["received"]
        assert stats["fill"] + stats["consumed"] + stats["dropped"] == stats["received"]
    grid.close()


def test_a_device_waiting_for_its_stream_gets_its_rate_not_double(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: one device at 10 samples/s that waits for b*K = 100 samples each round.
    device = VirtualDevice("d", rate=10.0, initial=0)
    settings = _streaming(fast, 5, 10, b_min=10, wait_policy="wait")
    grid = InProcessGrid([device], tmp_path / "buffers", settings, step_time=step_time)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    # Assert: 500 samples trained cannot have taken less than 50 s of a 10/s stream, and each
    # round after the first waits for what the last one's training time did not bring.
    assert sum(r.devices["d"].num_examples for r in records) == 500
    assert grid.clock >= 50.0
    compute = 10 * step_time(10)
    for r in records[1:]:
        wait = r.devices["d"].wait_s
        assert wait == pytest.approx(10.0 - compute, abs=0.11), r.round


def test_replay_delivers_rate_times_wall_time_without_losing_fractions(tmp_path: Path) -> None:
    # Prepare: top-ups every 0.15 s at 10 samples/s (1.5 per call; int() lost the halves).
    path = tmp_path / "sim-0.sqlite"
    stream = StreamSamples("sim-0", 0, DEFAULT_SHAPE, DEFAULT_NUM_CLASSES)
    # Execute
    counts = [
        replay_into(path, stream, 10.0, initial=7, capacity=10_000, now=0.15 * i) for i in range(21)
    ]
    # Assert: 7 at the start, then 30 over 3 s.
    assert sum(counts) == arrived(10.0, 3.0, 7) == 37
    with BufferStore(path) as store:
        assert store.fill == 37
    assert math.isclose(0.15 * 20, 3.0)


def test_a_stream_always_ahead_is_never_capped(tmp_path: Path, fast: Fast) -> None:
    # Prepare: streams that always have what a round takes, the availability cap on (the
    # default). (Before they published no rate, read as starved: batches fell to b-min.)
    devices = [VirtualDevice(f"d{i}", rate=math.inf, initial=0) for i in range(2)]
    settings = fast(num_rounds=4, eval_samples=100)
    grid = InProcessGrid(devices, tmp_path / "buffers", settings, step_time=step_time)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    grid.close()
    # Assert
    assert settings.availability_cap
    assert [r.sum_b for r in records] == [settings.global_batch] * 4
