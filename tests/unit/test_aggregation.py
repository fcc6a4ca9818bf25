"""The streaming aggregation rules: sample-weighted (fedavg) and normalised (fednova)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.aggregation import NormalisedMean, WeightedMean

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
