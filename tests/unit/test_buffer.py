"""Buffer store: policies, capacity, counters, de-duplication, concurrent processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_client.runtime.buffer import BufferStore, BufferStoreError
from edge_client.wire.frames import SampleBatch

SHAPE = (2, 3)


def batch(start: int, n: int, publisher: str | None = None, seq: int = 0) -> SampleBatch:
    """Samples whose label and timestamp are their global index: easy to trace."""
    idx = np.arange(start, start + n)
    x = np.repeat(idx.astype(np.float32), 6).reshape(n, *SHAPE)
    return SampleBatch(
        x=x, y=idx.astype(np.int64), ts=idx.astype(np.float64), publisher=publisher, seq=seq
    )


def make(tmp_path: Path, **kw: object) -> BufferStore:
    return BufferStore(tmp_path / "buf.sqlite", shape=SHAPE, **kw)  # type: ignore[arg-type]


def test_take_is_fifo_across_partial_chunks(tmp_path: Path) -> None:
    # Prepare
    store = make(tmp_path)
    store.append([batch(0, 5), batch(5, 5), batch(10, 5)])
    # Execute
    first = store.take(7)
    second = store.take(100)
    # Assert
    assert list(first.y) == list(range(7))
    assert list(second.y) == list(range(7, 15))
    np.testing.assert_array_equal(second.x[:, 0, 0], np.arange(7, 15))
    assert second.x.shape == (8, *SHAPE)
    assert len(store.take(3)) == 0
    s = store.stats()
    assert (s["accepted"], s["consumed"], s["fill"]) == (15, 15, 0)


def test_truncation_keeps_newest_and_counts_drops(tmp_path: Path) -> None:
    store = make(tmp_path, policy="truncation", capacity=10)
    store.append([batch(0, 4), batch(4, 4)])
    result = store.append([batch(8, 5)])  # 13 > 10: the 3 oldest go
    big = store.append([batch(13, 25)])  # one message bigger than the whole buffer

    assert result.dropped == 3
    assert big.accepted == 10 and big.dropped == 15 + 10
    s = store.stats()
    assert (s["received"], s["accepted"], s["dropped"], s["fill"]) == (38, 23, 28, 10)
    assert list(store.take(100).y) == list(range(28, 38))


def test_persistence_keeps_oldest_and_drops_newest(tmp_path: Path) -> None:
    store = make(tmp_path, policy="persistence", capacity=10)
    store.append([batch(0, 8)])
    result = store.append([batch(8, 5)])  # only 2 fit: samples 8, 9 kept, 10-12 dropped
    store.take(4)
    store.append([batch(13, 6)])  # 4 free again: 13-16 kept, 17-18 dropped

    assert (result.accepted, result.dropped) == (2, 3)
    s = store.stats()
    assert (s["accepted"], s["dropped"], s["consumed"], s["fill"]) == (14, 5, 4, 10)
    assert list(store.take(100).y) == [4, 5, 6, 7, 8, 9, 13, 14, 15, 16]


def test_capacity_in_bytes_bounds_the_buffer(tmp_path: Path) -> None:
    per_sample = 4 * 6 + 16
    store = make(tmp_path, capacity=1000, capacity_bytes=5 * per_sample)
    store.append([batch(0, 8)])
    assert store.capacity == 5 and store.fill == 5


def test_duplicates_by_publisher_sequence_are_dropped(tmp_path: Path) -> None:
    store = make(tmp_path)
    store.append([batch(0, 2, "p", 0), batch(2, 2, "p", 1), batch(4, 2, None)])
    result = store.append([batch(2, 2, "p", 1), batch(4, 2, "p", 2), batch(0, 2, "q", 0)])
    again = store.append([batch(0, 2, "p", 0)])

    assert result.duplicates == 1 and result.accepted == 4
    assert again.duplicates == 1 and again.accepted == 0
    s = store.stats()
    assert (s["duplicates"], s["accepted"], s["messages"]) == (2, 10, 7)


def test_rejected_counters_by_reason(tmp_path: Path) -> None:
    store = make(tmp_path)
    store.append([], rejected={"bad-magic": 2, "non-finite": 1})
    store.append([batch(0, 1)], rejected={"bad-magic": 1})
    s = store.stats()
    assert s["rejected"] == 4
    assert s["rejected-by-reason"] == {"bad-magic": 3, "non-finite": 1}
    assert s["messages"] == 5


def test_state_survives_reopening_and_checks_config(tmp_path: Path) -> None:
    store = make(tmp_path, policy="persistence", capacity=50)
    store.append([batch(0, 3, "p", 0)], rate=12.5)
    store.close()

    reopened = BufferStore(tmp_path / "buf.sqlite")  # a reader: no config given

    assert (reopened.policy, reopened.capacity, reopened.fill) == ("persistence", 50, 3)
    assert reopened.stats()["rate"] == 12.5
    assert reopened.append([batch(0, 3, "p", 0)]).duplicates == 1  # seq memory persisted
    with pytest.raises(BufferStoreError, match="shape"):
        BufferStore(tmp_path / "buf.sqlite", shape=(3, 3))


def test_bad_paths_and_config_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(BufferStoreError, match="no buffer"):
        BufferStore(tmp_path / "missing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BufferStoreError, match="not a fedstream buffer"):
        BufferStore(junk, shape=SHAPE)
    with pytest.raises(BufferStoreError, match="policy"):
        make(tmp_path, policy="lifo")
    with pytest.raises(BufferStoreError, match="capacity"):
        make(tmp_path, capacity=0)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(BufferStoreError, match="not an initialised"):
        BufferStore(empty)


def _writer(path: str, start: int, messages: int, per: int) -> None:
    store = BufferStore(path)
    for m in range(messages):
        store.append([batch(start + m * per, per, f"w{start}", m)])
    store.close()


def _taker(path: str, out: mp.Queue, writers_done: Any) -> None:  # type: ignore[type-arg]
    store = BufferStore(path)
    got: list[int] = []
    while True:
        done = writers_done.is_set()  # read before taking: then an empty take is final
        taken = store.take(37)
        got.extend(int(v) for v in taken.y)
        if not len(taken) and done:
            break
    store.close()
    out.put(got)


def test_concurrent_writer_and_takers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    # Prepare: two writer processes and two taker processes on one file.
    path = str(tmp_path / "buf.sqlite")
    make(tmp_path, policy="persistence", capacity=10**9).close()
    per, messages = 7, 300
    total = 2 * per * messages
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    writers_done = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(path, s, messages, per)) for s in (0, 10**6)]
    takers = [ctx.Process(target=_taker, args=(path, out, writers_done)) for _ in range(2)]
    # Execute
    for p in writers + takers:
        p.start()
    for p in writers:
        p.join(120)
    writers_done.set()
    taken = [out.get(timeout=120) for _ in takers]
    for p in takers:
        p.join(30)
    # Assert: every sample taken exactly once, each writer's stream in order per taker.
    every = sorted(taken[0] + taken[1])
    expected = sorted(list(range(per * messages)) + list(range(10**6, 10**6 + per * messages)))
    assert every == expected
    for got in taken:
        for lo in (0, 10**6):
            mine = [v for v in got if lo <= v < lo + 10**6]
            assert mine == sorted(mine)
    s = BufferStore(path).stats()
    assert (s["accepted"], s["consumed"], s["fill"]) == (total, total, 0)


def test_held_samples_go_back_first_when_their_round_dies_and_are_spent_once_settled(
    tmp_path: Path,
) -> None:
    # Prepare: 15 samples; a round holds 7 (0..6), then 5 more arrive, then its trainer dies.
    store = make(tmp_path)
    store.append([batch(0, 10), batch(10, 5)])
    store.take(7, hold=True)
    store.append([batch(15, 5)])
    # Execute: the next round's trainer (a new process: the file reopened) restores them.
    store.close()
    again = make(tmp_path)
    back = again.restore_taken()
    taken = again.take(100, hold=True)
    again.settle_taken()
    # Assert: none lost, none twice, in the order they came; the counters add up.
    stats = again.stats()
    assert back == 7 and list(taken.y) == list(range(20))
    assert taken.x[3, 0, 0] == 3.0 and list(taken.ts) == list(range(20))
    assert again.restore_taken() == 0  # settled: nothing goes back
    assert stats["consumed"] == 20 and stats["fill"] == 0 and stats["accepted"] == 20


def test_restored_samples_past_a_truncation_buffers_capacity_are_dropped_oldest_first(
    tmp_path: Path,
) -> None:
    # Prepare: capacity 10; a round holds 6, then 8 more arrive (fill 4 + 8 = 12 -> 10).
    store = make(tmp_path, capacity=10)
    store.append([batch(0, 10)])
    store.take(6, hold=True)
    store.append([batch(10, 8)])
    # Execute
    store.restore_taken()
    # Assert: the buffer keeps the newest 10, as if the round had never taken any.
    stats = store.stats()
    assert list(store.take(100).y) == list(range(8, 18))
    assert stats["fill"] == 10 and stats["dropped"] == 2 + 6 and stats["consumed"] == 0
