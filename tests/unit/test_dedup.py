"""Exact de-duplication of QoS 1 redeliveries, also when a stream arrives out of order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import DEDUP_WINDOW
from edge_client.runtime.dedup import SeqWindow
from edge_client.wire.frames import SampleBatch


def feed(window: SeqWindow, seqs: list[int]) -> list[int]:
    """The numbers the window lets through (adding each)."""
    new = []
    for s in seqs:
        if not window.seen(s):
            window.add(s)
            new.append(s)
    return new


def test_an_in_order_stream_keeps_no_bitmap_and_drops_redeliveries() -> None:
    window = SeqWindow.starting_at(0)  # publishers count from 0

    new = feed(window, [*range(0, 101), 0, 50, 99, 100])

    assert new == list(range(0, 101)) and window.floor == 100 and window.bits == 0
    assert window.to_bytes() == b""


def test_a_broker_restart_reorder_loses_nothing_and_duplicates_nothing() -> None:
    # Prepare: what the broker-crash fault test saw: 1..367 delivered; after the restart
    # the restored queue replays 184..367, then the publisher's newest message (1069)
    # overtakes the 700 it resends (368..1068).
    window = SeqWindow.starting_at(0)
    arrivals = [*range(0, 368), *range(184, 368), 1069, *range(368, 1069), *range(1070, 1200)]
    # Execute
    new = feed(window, arrivals)
    # Assert
    assert sorted(new) == list(range(0, 1200)) and len(new) == 1200
    assert window.floor == 1199 and window.bits == 0


def test_a_new_publishers_queue_may_arrive_out_of_order() -> None:
    window = SeqWindow.starting_at(5)

    new = feed(window, [5, 6, 0, 1, 2, 3, 4, 7, 3])

    assert new == [5, 6, 0, 1, 2, 3, 4, 7] and window.floor == 7


def test_state_stays_bounded_whatever_the_numbers() -> None:
    # A daemon that meets a publisher mid-stream, then a hostile jump to 2**62.
    window = SeqWindow.starting_at(10**6)
    feed(window, list(range(10**6, 10**6 + 2000)))
    assert window.bits.bit_length() <= DEDUP_WINDOW

    feed(window, [2**62])

    assert window.bits.bit_length() <= DEDUP_WINDOW and len(window.to_bytes()) <= 8192
    assert window.seen(10**6 + 5) and window.seen(2**62) and not window.seen(2**62 + 1)


def test_a_gap_that_never_fills_is_forgotten_after_the_window() -> None:
    window = SeqWindow.starting_at(0)
    feed(window, [0, 1, 3])  # 2 is lost for good
    assert window.floor == 1 and not window.seen(2)

    feed(window, list(range(4, DEDUP_WINDOW + 10)))

    assert window.seen(2) and window.floor > 2


def test_the_window_survives_in_the_buffer_file(tmp_path: Path) -> None:
    # Prepare: out-of-order arrivals split over two transactions and a reopened file.
    def batch(seq: int) -> SampleBatch:
        return SampleBatch(
            np.zeros((1, 2), np.float32), np.zeros(1, np.int64), np.zeros(1), "p", seq
        )

    path = tmp_path / "b.sqlite"
    with BufferStore(path, shape=(2,)) as store:
        first = store.append([batch(s) for s in (1, 2, 5, 6)])
    # Execute
    with BufferStore(path) as store:
        second = store.append([batch(s) for s in (3, 4, 5, 6, 7, 1)])
        stats = store.stats()
    # Assert: 3 and 4 are new although 6 was stored before them; 5, 6 and 1 are redeliveries.
    assert (first.received, first.duplicates) == (4, 0)
    assert (second.received, second.duplicates) == (3, 3)
    assert stats["received"] == 7 and stats["duplicates"] == 3
