"""The streaming aggregation rules: sample-weighted (fedavg), normalised (fednova), and
normalised with random-effects weights (adaptive)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.aggregation import Accumulator, AdaptiveMean, NormalisedMean, WeightedMean
from aggregator.heterogeneity import Heterogeneity
from tests.helpers import fitted

SHAPES = {"w": (2,)}


def test_fedavg_weighs_each_update_by_the_samples_it_trained_on() -> None:
    # Prepare: a fast device that trained 300 samples and a slow one that trained 100.
    acc = WeightedMean(SHAPES)
    # Execute
    acc.update({"w": np.array([1.0, 0.0])}, 300, "fast", 10)
    acc.update({"w": np.array([0.0, 1.0])}, 100, "slow", 10)
    result = acc.result()
    # Assert
    assert result is not None
    np.testing.assert_allclose(result[0]["w"], [0.75, 0.25])


def test_fednova_weighs_devices_equally_whatever_their_batch() -> None:
    # Prepare: the same two updates.
    acc = NormalisedMean(SHAPES)
    # Execute
    acc.update({"w": np.array([1.0, 0.0])}, 300, "fast", 10)
    acc.update({"w": np.array([0.0, 1.0])}, 100, "slow", 10)
    result = acc.result()
    # Assert: each device's objective counts once.
    assert result is not None
    np.testing.assert_allclose(result[0]["w"], [0.5, 0.5])
    assert result[1] == ["fast", "slow"]


def test_fednova_normalises_by_local_steps() -> None:
    # Prepare: one device ran 4 steps, another 2 (hand-computed: mean(d_i / tau_i) * mean(tau)
    # = ((4, 0) / 4 + (0, 2) / 2) / 2 * 3 = (1.5, 1.5)).
    acc = NormalisedMean(SHAPES)
    # Execute
    acc.update({"w": np.array([4.0, 0.0])}, 40, "a", 4)
    acc.update({"w": np.array([0.0, 2.0])}, 20, "b", 2)
    result = acc.result()
    # Assert
    assert result is not None
    np.testing.assert_allclose(result[0]["w"], [1.5, 1.5])


@pytest.mark.parametrize("rule", [WeightedMean, NormalisedMean])
def test_no_update_no_result(rule: type[WeightedMean] | type[NormalisedMean]) -> None:
    assert rule(SHAPES).result() is None


# The hand-computed case: two devices of batches 8 and 56, 20 local steps each
# (160 and 1120 samples), each update one unit per step along its own axis.
SLOW, FAST = (np.array([0.0, 20.0]), 160), (np.array([20.0, 0.0]), 1120)


def _two_devices(acc: Accumulator) -> np.ndarray:
    acc.update({"w": SLOW[0]}, SLOW[1], "slow", 20)
    acc.update({"w": FAST[0]}, FAST[1], "fast", 20)
    result = acc.result()
    assert result is not None
    return result[0]["w"]


def test_weights_of_batches_8_and_56_under_fedavg_and_fednova() -> None:
    # Prepare / Execute / Assert: samples 160 : 1120 = 0.125 : 0.875; fednova 0.5 : 0.5
    # (each times the 20 steps of the per-step update).
    np.testing.assert_allclose(_two_devices(WeightedMean(SHAPES)), [17.5, 2.5])
    np.testing.assert_allclose(_two_devices(NormalisedMean(SHAPES)), [10.0, 10.0])


def test_adaptive_weights_of_batches_8_and_56_follow_the_estimated_ratio() -> None:
    # Prepare: a fit of r = S / H = 480 samples, so w = n / (n + 480): 160 / 640 = 0.25 and
    # 1120 / 1600 = 0.7, shares 0.25 / 0.95 = 0.263158 and 0.7 / 0.95 = 0.736842.
    acc = AdaptiveMean(SHAPES, fitted(h=1.0, s=480.0))
    # Execute
    combined = _two_devices(acc)
    # Assert: 20 steps x the shares, to the digit.
    assert acc.ratio == pytest.approx(480.0)
    np.testing.assert_allclose(combined, [14.736842105, 5.263157895], rtol=1e-9)


def test_adaptive_weighs_equally_then_by_samples_without_heterogeneity() -> None:
    # Prepare / Execute: a fresh estimate, and one that sees only sampling noise (H = 0).
    fresh = _two_devices(AdaptiveMean(SHAPES, Heterogeneity()))
    alike = _two_devices(AdaptiveMean(SHAPES, fitted(h=0.0, s=480.0)))
    # Assert: fednova's 0.5 : 0.5, then fedavg's 0.125 : 0.875.
    np.testing.assert_allclose(fresh, [10.0, 10.0])
    np.testing.assert_allclose(alike, [17.5, 2.5], rtol=1e-6)


def test_adaptive_caps_no_device_above_the_weight_of_one() -> None:
    # Prepare: r = 480; a device that claims a million samples.
    acc = AdaptiveMean(SHAPES, fitted(h=1.0, s=480.0))
    # Execute
    acc.update({"w": np.array([20.0, 0.0])}, 1_000_000, "big", 20)
    acc.update({"w": np.array([0.0, 20.0])}, 1120, "fair", 20)
    result = acc.result()
    # Assert: its weight is below 1 (1e6 / 1000480), the other's 0.7: shares 0.588 / 0.412.
    assert result is not None
    big = 1_000_000 / 1_000_480
    np.testing.assert_allclose(result[0]["w"], 20 * np.array([big, 0.7]) / (big + 0.7))


def test_adaptive_feeds_the_round_into_the_estimate() -> None:
    # Prepare: three devices, so the round has three pairs.
    het = Heterogeneity()
    acc = AdaptiveMean(SHAPES, het)
    for i, n in enumerate((100, 200, 400)):
        acc.update({"w": np.array([float(i), 1.0]) * 5}, n, f"d{i}", 5)
    # Execute
    acc.result()
    # Assert
    assert het.rounds == 1
