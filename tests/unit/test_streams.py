"""Publisher-side generators: synthetic task, rate sets, arrivals, label skew, files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from edge_client.emulation.constants import REPLAY_GAP_S
from edge_client.emulation.publisher import Prefetched, PublisherConfig
from edge_client.emulation.reading_replay import SeriesReadings, series_channels
from edge_client.emulation.schedule import arrival_offsets, draw_rate
from edge_client.emulation.sources import (
    ArraySource,
    SyntheticSource,
    label_distribution,
)
from edge_client.runtime.mqtt import BrokerURL
from edge_client.runtime.seeding import device_rng
from edge_client.task.recordings import load_recording
from edge_client.task.synthetic import SensorTask


def test_synthetic_task_is_learnable_but_not_linear() -> None:
    # Nearest-centroid on raw values is weak; on spectral magnitudes it is strong.
    task = SensorTask()
    rng = np.random.default_rng(0)
    x, y = task.sample(3000, rng)
    xt, yt = task.sample(1000, rng)

    def centroid_acc(f, ft) -> float:
        cents = np.stack([f[y == k].mean(0) for k in range(task.num_classes)])
        return float((((ft[:, None] - cents[None]) ** 2).sum(-1).argmin(1) == yt).mean())

    raw = centroid_acc(x.reshape(len(x), -1), xt.reshape(len(xt), -1))
    spec = centroid_acc(
        np.abs(np.fft.rfft(x, axis=-1)).reshape(len(x), -1),
        np.abs(np.fft.rfft(xt, axis=-1)).reshape(len(xt), -1),
    )
    assert x.shape == (3000, 6, 32) and x.dtype == np.float32
    assert raw < 0.6 < spec


def test_synthetic_is_deterministic_per_seed() -> None:
    a = SyntheticSource(SensorTask(), device_rng(3, "dev-1")).next(10)
    b = SyntheticSource(SensorTask(), device_rng(3, "dev-1")).next(10)
    c = SyntheticSource(SensorTask(), device_rng(3, "dev-2")).next(10)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_label_skew_options() -> None:
    rng = np.random.default_rng(0)
    only = label_distribution(6, rng, labels=[1, 4])
    src = SyntheticSource(SensorTask(), rng, only)
    _, y = src.next(500)
    skew = label_distribution(6, rng, dirichlet=0.1)

    assert set(np.unique(y)) == {1, 4}
    assert skew.max() > 0.5 and skew.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        label_distribution(6, rng, labels=[7])
    with pytest.raises(ValueError):
        label_distribution(6, rng, labels=[1], dirichlet=1.0)


def test_rate_sets_match_their_moments() -> None:
    rng = np.random.default_rng(0)
    for name, mean, sd in [("S2", 300, 112), ("S2p", 256, 28)]:
        rates = np.array([draw_rate(name, rng) for _ in range(20000)])
        assert rates.mean() == pytest.approx(mean, rel=0.03)
        assert rates.std() == pytest.approx(sd, rel=0.05)
    assert min(draw_rate("S1", rng) for _ in range(2000)) >= 1.0
    with pytest.raises(ValueError, match="rate set"):
        draw_rate("S9", rng)


@pytest.mark.parametrize("dist", ["constant", "poisson", "bursty"])
def test_arrival_processes_have_the_mean_rate(dist: str) -> None:
    times = np.array(list(itertools.islice(arrival_offsets(50.0, dist, device_rng(0, "d")), 5000)))
    assert np.all(np.diff(times) >= 0)
    assert 5000 / times[-1] == pytest.approx(50.0, rel=0.05)
    if dist == "bursty":  # silent for 3/4 of each 2 s period
        assert (np.diff(times) > 1.0).sum() > 10


def test_file_sources(tmp_path: Path) -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    np.savez(tmp_path / "s.npz", x=x, y=np.array([0, 1, 0, 1]))
    (tmp_path / "s.csv").write_text("label,a,b\n1,0.5,2\n0,1.5,3\n")
    (tmp_path / "bad.csv").write_text("1,x\n")
    (tmp_path / "s.txt").write_text("1,2\n")

    xs, ys = load_recording(tmp_path / "s.npz")
    xc, yc = load_recording(tmp_path / "s.csv")
    replay = ArraySource(xs, ys, np.random.default_rng(0))
    first, _ = replay.next(6)

    assert xs.shape == (4, 2, 3) and list(yc) == [1, 0] and xc.shape == (2, 2)
    np.testing.assert_array_equal(first[4], x[0])  # replay wraps around
    with pytest.raises(ValueError, match="numbers"):
        load_recording(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match=r"\.npz or \.csv"):
        load_recording(tmp_path / "s.txt")


def test_a_prefetched_source_hands_out_its_chunks_in_order_whatever_the_request_sizes() -> None:
    # Prepare: a replay whose rows are numbered, and the same drawn a chunk of 4 at a time
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10) % 3
    prefetched = Prefetched(ArraySource(x, y, np.random.default_rng(0)), chunk=4)
    # Execute: requests across chunk boundaries, empty, and bigger than a chunk
    parts = [prefetched.next(n) for n in (1, 3, 0, 2, 7, 1)]
    # Assert: the rows in the source's own order, wrapping as it wraps, labels with them
    rows = np.concatenate([p[0][:, 0] for p in parts]).astype(int)
    assert list(rows) == [i % 10 for i in range(14)]
    assert list(np.concatenate([p[1] for p in parts])) == [i % 10 % 3 for i in range(14)]
    assert prefetched.shape == (1,) and parts[2][0].shape == (0, 1)
    with pytest.raises(ValueError, match="at least 1"):
        Prefetched(ArraySource(x, y, np.random.default_rng(0)), chunk=0)


def test_a_series_is_published_reading_by_reading_evenly_stamped_with_a_gap_at_each_pass(
    tmp_path: Path,
) -> None:
    # Prepare: 3 readings of two channels, with a time column that is not a channel
    (tmp_path / "s.csv").write_text("date,temp,rh\n1,20.5,40\n2,21.0,41\n3,21.5,42\n")
    readings = SeriesReadings.from_file(tmp_path / "s.csv", rate=10.0)
    readings.start = 100.0
    # Execute
    first = json.loads(readings.payload(1))
    rest = json.loads(readings.payload(3))
    # Assert: ts = start + i / rate, and the second pass REPLAY_GAP_S later
    assert first == {"ts": 100.0, "temp": 20.5, "rh": 40.0}
    assert [r["ts"] for r in rest] == [100.1, 100.2, 100.3 + REPLAY_GAP_S]
    assert [r["temp"] for r in rest] == [21.0, 21.5, 20.5]
    assert series_channels(tmp_path / "s.csv") == ["temp", "rh"]


def test_publishing_to_a_wildcard_topic_is_refused() -> None:
    with pytest.raises(ValueError, match="without wildcards"):
        PublisherConfig(BrokerURL.parse("mqtt://h"), "d", rate=1.0, count=1, topic="a/+/b")


def test_readings_bigger_than_the_largest_message_go_as_several_in_order() -> None:
    # Prepare: 100 readings of 3 channels, about 60 bytes each, a 1 kB limit
    values = np.arange(300, dtype=np.float32).reshape(100, 3)
    readings = SeriesReadings(values, ["a", "b", "c"], rate=10.0, start=0.0)
    # Execute
    payloads = readings.payloads(100, max_payload=1000)
    # Assert: each fits; together, every reading once, in order
    assert len(payloads) > 1 and all(len(p) <= 1000 for p in payloads)
    decoded = [
        r for p in payloads for r in (json.loads(p) if p.startswith(b"[") else [json.loads(p)])
    ]
    assert [r["a"] for r in decoded] == values[:, 0].tolist()
    with pytest.raises(ValueError, match="one reading makes a"):
        readings.payloads(1, max_payload=10)
