"""The real recording of ``fedstream bench people``: windows in recorded order, and a wheel
whose digest is not the pinned one refused."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from deploy.bench.watch import MEMBER, WHEEL, watch_people


def _wheel(cache: Path) -> str:
    """A wheel laid out as seglearn's, with two people's series; its SHA-256."""
    data = {
        "X": [np.arange(130 * 6, dtype=float).reshape(130, 6), np.ones((70, 6)), np.zeros((64, 6))],
        "y": np.array([3, 1, 0]),
        "subject": np.array([2, 1, 2]),
    }
    buf = io.BytesIO()
    np.save(buf, np.array(data, dtype=object), allow_pickle=True)
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / WHEEL, "w") as z:
        z.writestr(MEMBER, buf.getvalue())
    return hashlib.sha256((cache / WHEEL).read_bytes()).hexdigest()


def test_each_persons_series_become_windows_in_recorded_order(tmp_path: Path) -> None:
    # Prepare
    digest = _wheel(tmp_path)
    # Execute
    people = watch_people(window=64, cache=tmp_path, sha256=digest)
    # Assert: person 1 first (70 readings: 1 window), then person 2's series in file order
    # (130: 2 windows, the last 2 readings dropped; 64: 1); channels first, units as recorded
    assert people.x.shape == (4, 6, 64)
    assert people.subject.tolist() == [1, 2, 2, 2] and people.y.tolist() == [1, 3, 3, 0]
    assert people.x[1, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert people.x[2, 0, 0] == 64 * 6


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    _wheel(tmp_path)
    with pytest.raises(RuntimeError, match=r"SHA-256 .* expected"):
        watch_people(cache=tmp_path)
