"""The synthetic multi-subject recording: laid out as UCI HAR is (subjects one after another,
activities in blocks, every activity twice), and the same for the same seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_client.emulation.partitions import split_recording
from edge_client.emulation.people import PEOPLE_KEY, people_recording
from edge_client.wire.partitioning import scheme_of


def test_subjects_come_one_after_another_with_their_activities_in_blocks() -> None:
    # Execute
    people = people_recording(5, seed=3)
    # Assert: contiguous subjects 1..5 of 281-409 windows, each doing all 6 activities in
    # 12 blocks (two passes of the protocol), so a stream is never shuffled
    changes = np.flatnonzero(np.diff(people.subject)) + 1
    assert people.subject[0] == 1 and list(people.subject[changes]) == [2, 3, 4, 5]
    for person in range(1, 6):
        labels = people.y[people.subject == person]
        assert 281 <= len(labels) <= 409 + 12  # rounding of the blocks' shares
        blocks = 1 + np.count_nonzero(np.diff(labels))
        assert sorted(set(labels.tolist())) == list(range(6)) and blocks <= 12
        assert blocks >= 6
    assert people.x.shape == (len(people.y), 6, 32) and people.x.dtype == np.float32


def test_the_same_seed_draws_the_same_recording_and_people_differ() -> None:
    # Execute
    one, two, other = (
        people_recording(3, seed=1),
        people_recording(3, seed=1),
        people_recording(3, seed=2),
    )
    # Assert
    assert np.array_equal(one.x, two.x) and np.array_equal(one.y, two.y)
    assert not np.array_equal(one.y, other.y) or not np.array_equal(one.x, other.x)
    # each person's sensor is shifted: per-channel means differ between people
    means = [one.x[one.subject == s].mean(axis=(0, 2)) for s in (1, 2, 3)]
    assert np.abs(means[0] - means[1]).max() > 0.1


def test_a_saved_recording_splits_into_one_device_per_subject_in_recorded_order(
    tmp_path: Path,
) -> None:
    # Prepare
    people = people_recording(4, seed=0)
    path = people.save(tmp_path / "people.npz")
    # Execute
    split = split_recording(str(path), scheme_of("", PEOPLE_KEY), key=PEOPLE_KEY)
    # Assert: 4 devices, each holding exactly its subject's windows in recorded order
    assert len(split.partitions) == 4
    for i in range(4):
        rows = np.asarray(split.partitions.indices[i])
        assert np.all(np.diff(rows) > 0)
        assert len(set(people.subject[rows].tolist())) == 1


def test_no_subjects_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one subject"):
        people_recording(0)
