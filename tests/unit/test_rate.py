"""Stream-rate EWMA."""

from __future__ import annotations

import numpy as np
import pytest

from edge_client.runtime.rate import RateEstimator


def feed(est: RateEstimator, rate: float, start: float, seconds: float, tick: float) -> float:
    t = start
    while t < start + seconds:
        t += tick
        est.add(round(rate * tick), t)
        est.update(t)
    return t


def test_converges_to_constant_rate() -> None:
    est = RateEstimator(now=0.0, tau=5.0, min_tick=0.5)
    feed(est, 200.0, 0.0, 10.0, 0.1)
    assert est.rate == pytest.approx(200.0, rel=0.02)


def test_idle_time_before_the_stream_does_not_bias_it() -> None:
    est = RateEstimator(now=0.0, tau=5.0)
    est.update(30.0)  # 30 s with nothing
    feed(est, 50.0, 30.0, 3.0, 0.1)
    assert est.rate == pytest.approx(50.0, rel=0.1)


def test_tracks_a_step_with_time_constant_tau() -> None:
    est = RateEstimator(now=0.0, tau=5.0, min_tick=0.5)
    t = feed(est, 100.0, 0.0, 20.0, 0.5)
    feed(est, 300.0, t, 5.0, 0.5)  # one time constant after a step to 300
    expected = 300.0 - 200.0 * np.exp(-1.0)
    assert est.rate == pytest.approx(expected, rel=0.05)


def test_decays_when_the_stream_stops() -> None:
    est = RateEstimator(now=0.0, tau=2.0, min_tick=0.5)
    t = feed(est, 100.0, 0.0, 5.0, 0.5)
    est.update(t + 20.0)
    assert est.rate < 1.0


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        RateEstimator(now=0.0, tau=0.0)


def test_batches_recorded_after_each_update_read_the_rate_from_the_first_window() -> None:
    # Prepare: the ingest daemon's order: the rate it stores with a commit, then that
    # commit's samples; 100 samples committed every 0.5 s (200/s)
    est = RateEstimator(now=0.0, tau=5.0, min_tick=0.5)
    rates = []
    # Execute
    for k in range(1, 7):
        rates.append(est.update(0.5 * k))
        est.add(100, 0.5 * k)
    # Assert: time zero, an empty window that moves it, then the stream's rate (not an
    # estimate climbing from 0 on the EWMA's time constant)
    assert rates[:2] == [0.0, 0.0]
    assert rates[2:] == pytest.approx([200.0] * 4, rel=1e-6)
