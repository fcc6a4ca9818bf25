"""The lazy replay against the eager one: the same fill, drops and samples taken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_client.emulation.lazy_buffer import CHUNK, LazyBuffer, StreamSamples
from edge_client.emulation.replay import replay_into
from edge_client.runtime.buffer import COUNTERS, BufferStore

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
