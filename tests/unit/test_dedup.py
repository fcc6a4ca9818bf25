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


def test_a_gap_counts_missing_until_the_late_message_arrives() -> None:
    # Prepare: 0..9 but 3, 4 and 7
    window = SeqWindow.starting_at(0)
    # Execute
    feed(window, [0, 1, 2, 5, 6, 8, 9])
    before_late = window.missing
    feed(window, [4])
    # Assert: three numbers never came; one of them came late after all
    assert before_late == 3 and window.missing == 2 and window.lost == 0


def test_numbers_before_the_first_one_met_are_not_missing_until_an_older_one_arrives() -> None:
    # Prepare: the daemon subscribed after the publisher had sent 0..999
    window = SeqWindow.starting_at(1000)
    # Execute / Assert: 1000..1005 but 1003: one missing; 990 then widens the span
    feed(window, [1000, 1001, 1002, 1004, 1005])
    assert window.missing == 1
    feed(window, [990])
    assert window.missing == 1 + 9  # 991..999 did not come either


def test_a_gap_the_window_forgets_stays_counted_and_a_jump_counts_at_most_the_window() -> None:
    # Prepare: 0 and 1, then numbers further on than the window spans
    window = SeqWindow.starting_at(0)
    feed(window, [0, 1])
    # Execute: 2..9 never come; the stream goes on DEDUP_WINDOW + 10 numbers later
    feed(window, [DEDUP_WINDOW + 10])
    # Assert: what the window forgot (2..10) is lost, counted once; all of 0..W+10 but the
    # three that came are missing
    assert window.lost == 9 and window.missing == DEDUP_WINDOW + 11 - 3
    hostile = SeqWindow.starting_at(0)
    feed(hostile, [0, 2**62])
    assert hostile.lost == DEDUP_WINDOW and hostile.missing < 2 * DEDUP_WINDOW


def test_the_buffer_counts_missing_messages_durably(tmp_path: Path) -> None:
    # Prepare: publisher p sends 0..5 but 2 and 3; publisher q sends 0..2
    path = tmp_path / "b.sqlite"

    def message(publisher: str, seq: int) -> SampleBatch:
        return SampleBatch(
            np.zeros((1, 2), np.float32), np.zeros(1, np.int64), np.ones(1), publisher, seq
        )

    with BufferStore(path, shape=(2,)) as store:
        store.append([message("p", s) for s in (0, 1, 4)])
        store.append([message("q", s) for s in (0, 1, 2)] + [message("p", 5)])
        gapped = store.stats()["messages-missing"]
    # Execute: reopened (the daemon restarted), 3 arrives late, 2 never does
    with BufferStore(path) as store:
        store.append([message("p", 3)])
        after = store.stats()
    # Assert
    assert gapped == 2 and after["messages-missing"] == 1 and after["accepted"] == 8
