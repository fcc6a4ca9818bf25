"""The lazy replay against the eager one: the same fill, drops and samples taken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_client.emulation.lazy_buffer import CHUNK, LazyBuffer, RecordingSamples, StreamSamples
from edge_client.emulation.replay import replay_into
from edge_client.runtime.buffer import COUNTERS, BufferStore
from edge_client.runtime.trainer import _take, train_local
from edge_client.task.interface import Classification, init_model
from edge_client.wire.records import RoundPlan

SHAPE = (3, 8)
# (seconds since the stream started, samples a round then takes): slow rounds, a long gap
# that overflows the buffer, rounds that take more than is there, one that takes nothing.
SCHEDULE = [(0.0, 0), (1.5, 40), (2.2, 100), (10.0, 250), (10.5, 10), (30.0, 700), (30.2, 5)]


@pytest.mark.parametrize("policy", ["truncation", "persistence"])
def test_lazy_replay_matches_the_eager_replay_sample_for_sample(
    tmp_path: Path, policy: str
) -> None:
    # Prepare: one device's stream, replayed eagerly into a buffer file and lazily.
    kw = {"labels": [0, 2], "feature_shift": 0.3}
    samples = StreamSamples("dev-7", 3, SHAPE, 4, **kw)  # type: ignore[arg-type]
    lazy = LazyBuffer(samples, rate=100.0, capacity=300, policy=policy, initial=50)
    path, t0 = tmp_path / "dev-7.sqlite", 1_000.0
    for at, take in SCHEDULE:
        # Execute: the same top-ups at the same times, the same takes.
        arrived = replay_into(
            path, samples, 100.0, initial=50, capacity=300, now=t0 + at, policy=policy
        )
        assert lazy.advance(t0 + at) == arrived
        with BufferStore(path) as store:
            eager = store.take(take)
            stats = store.stats()
        got = lazy.take(take)
        # Assert: the same samples, in the same order, with the same arrival times, and
        # the counters a device reports.
        np.testing.assert_array_equal(got.x, eager.x)
        np.testing.assert_array_equal(got.y, eager.y)
        np.testing.assert_array_equal(got.ts, eager.ts)
        mine = lazy.stats()
        for key in (*COUNTERS, "fill", "rate", "capacity", "fill-bytes"):
            assert mine[key] == stats[key], (at, key)
    assert lazy.counters["dropped"] > 0  # the long gap overflowed the buffer
    assert lazy.counters["received"] == 50 + 3_020  # initial + floor(rate * 30.2 s)


def test_a_streams_samples_do_not_depend_on_how_they_are_asked_for() -> None:
    # Prepare
    stream = StreamSamples("dev-1", 0, SHAPE, 6)
    # Execute: across a chunk boundary, whole and in pieces.
    whole_x, whole_y = stream.range(CHUNK - 10, CHUNK + 30)
    parts = [stream.range(CHUNK - 10, CHUNK), stream.range(CHUNK, CHUNK + 30)]
    # Assert
    np.testing.assert_array_equal(whole_x, np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(whole_y, np.concatenate([p[1] for p in parts]))
    assert whole_x.shape == (40, *SHAPE) and whole_x.dtype == np.float32
    other = StreamSamples("dev-2", 0, SHAPE, 6).range(CHUNK - 10, CHUNK + 30)[0]
    assert not np.array_equal(whole_x, other)  # another device, another stream


def test_the_state_between_rounds_is_small_and_restores_the_buffer() -> None:
    # Prepare: a long-running stream, many rounds.
    samples = StreamSamples("dev-1", 0, SHAPE, 6)
    lazy = LazyBuffer(samples, rate=400.0, capacity=50_000, initial=2_000)
    for r in range(200):
        lazy.advance(100.0 + 5.0 * r)
        lazy.take(64)
    # Execute
    state = lazy.to_state()
    back = LazyBuffer.from_state(samples, state)
    # Assert: a few hundred bytes, whatever the stream delivered; the same buffer.
    assert len(repr(state)) < 1_000
    assert back.fill == lazy.fill and back.stats()["dropped"] == lazy.stats()["dropped"]
    np.testing.assert_array_equal(back.take(10).x, lazy.take(10).x)


def test_bad_buffer_settings_are_refused() -> None:
    samples = StreamSamples("dev-1", 0, SHAPE, 6)
    with pytest.raises(ValueError, match="unknown buffer policy"):
        LazyBuffer(samples, rate=1.0, capacity=10, policy="fifo")
    with pytest.raises(ValueError, match="capacity must be"):
        LazyBuffer(samples, rate=1.0, capacity=0)


def test_a_virtual_device_trains_on_what_it_holds_without_waiting_in_wall_time() -> None:
    # Prepare: a virtual device's buffer at its round's virtual time holding 50 samples, a
    # plan that would wait 30 s for b x K = 8 x 10 = 80 of them
    samples = StreamSamples("dev-0", 0, SHAPE, 4)
    lazy = LazyBuffer(samples, rate=1.0, capacity=300, initial=50)
    lazy.advance(100.0)
    plan = RoundPlan(8, 10, 0.1, wait_policy="wait", deadline_s=30.0)
    model = init_model(Classification(model="mlp"), SHAPE, 4, seed=0)
    # Execute
    result = train_local(model, lazy, plan)
    # Assert: nothing can arrive while it trains (its clock stands still), so it did not
    # wait, and trained on all it held: 5 per step
    assert not lazy.arriving
    assert result.wait_s < plan.deadline_s / 10
    assert result.batch_size == 5 and result.num_examples == 50 and lazy.fill == 0


def test_a_round_in_recorded_order_is_trained_in_shuffled_steps() -> None:
    # Prepare: a person's stream of 100 windows, 50 of one activity then 50 of another; a
    # round of K = 10 steps of b = 10 takes all of them
    x = np.arange(100 * 3 * 8, dtype=np.float32).reshape(100, 3, 8)
    y = np.repeat([0, 1], 50).astype(np.int64)
    lazy = LazyBuffer(RecordingSamples(x, y), rate=1.0, capacity=300, initial=100)
    lazy.advance(0.0)
    plan = RoundPlan(10, 10, 0.1)
    # Execute
    taken = _take(lazy, plan, 10, None, np.random.default_rng(0), None)
    # Assert: every sample once, but the steps mix the two activities (in recorded order,
    # every step would see one)
    assert sorted(taken.own_y.tolist()) == y.tolist()
    assert sorted(map(tuple, taken.own_x.reshape(100, -1).tolist())) == sorted(
        map(tuple, x.reshape(100, -1).tolist())
    )
    steps = taken.own_y.reshape(10, 10)
    assert sum(len(set(step.tolist())) == 2 for step in steps) >= 8
