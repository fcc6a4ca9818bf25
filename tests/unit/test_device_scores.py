"""Per-device scores (the device the model serves worst) and held-out scores per group."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from aggregator.round_log import rounds_only
from aggregator.server_app import run_rounds
from aggregator.server_eval import ServerEvaluation
from deploy.device_scores import fleet_scores, latest_scores
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.report import summarize
from edge_client.task.interface import Classification
from edge_client.task.synthetic import SensorTask
from edge_client.wire.records import ReplyMetrics
from edge_client.wire.run_config import RunSettings
from tests.helpers import round_record

Fast = Callable[..., RunSettings]
Fleet = Callable[..., list[VirtualDevice]]


def test_the_worst_ten_percent_is_the_mean_of_the_worst_tenth_by_the_metric() -> None:
    # Prepare: 20 devices scoring 0.05, 0.10, ..., 1.00
    scores = {f"d{i}": (i + 1) / 20 for i in range(20)}
    # Execute
    accuracy = fleet_scores(scores, higher_is_better=True)
    error = fleet_scores(scores, higher_is_better=False)
    # Assert: the worst tenth is 2 devices: the lowest accuracies, or the highest errors
    assert accuracy is not None and error is not None
    assert accuracy.mean == pytest.approx(0.525) and accuracy.median == pytest.approx(0.525)
    assert accuracy.worst10 == pytest.approx((0.05 + 0.10) / 2) and accuracy.devices == 20
    assert error.worst10 == pytest.approx((1.00 + 0.95) / 2)
    assert fleet_scores({"only": 0.7}, True) == fleet_scores({"only": 0.7}, False)
    assert fleet_scores({}, True) is None


def test_the_summary_keeps_each_devices_latest_score_and_the_distribution() -> None:
    # Prepare: round 1: a 0.9, b 0.5; round 2: a 0.8 (b did not reply), c scored no sample
    def reply(metric: float, count: int = 10) -> ReplyMetrics:
        return ReplyMetrics(10, 10, 0.01, 1.0, eval_metric=metric, eval_count=count)

    one = round_record(round=1, devices={"a": reply(0.9), "b": reply(0.5)})
    two = round_record(round=2, devices={"a": reply(0.8), "c": reply(math.nan, 0)})
    # Execute
    summary = summarize([one, two], wall_s=1.0)
    # Assert
    assert latest_scores([one, two]) == {"a": 0.8, "b": 0.5}
    assert summary["device_scores"] == {"a": 0.8, "b": 0.5}
    assert summary["device_score_mean"] == pytest.approx(0.65)
    assert summary["device_score_median"] == pytest.approx(0.65)
    assert summary["device_score_worst10"] == pytest.approx(0.5)
    assert summary["device_score_per_round"]["worst10"] == [0.5, 0.8]
    assert summary["metric"] == "accuracy" and summary["test_by_group"] == {}


def test_held_out_people_are_scored_apart_and_their_scores_make_the_whole(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: a held-out file of 3 people, 40 windows each, keyed by "subject"
    task = SensorTask()
    x, y = task.sample(120, np.random.default_rng(4))
    test = tmp_path / "test.npz"
    np.savez(test, x=x, y=y, subject=np.repeat(["s7", "s8", "s9"], 40))
    settings = fast(num_rounds=2, eval_data=str(test), eval_group_by="subject")
    grid = InProcessGrid(fleet(1, 2), tmp_path / "buffers", settings)
    # Execute
    try:
        records = rounds_only(run_rounds(grid, settings))
    finally:
        grid.close()
    # Assert: every round scores each person; equal groups average to the whole
    for record in records:
        assert sorted(record.test_by_group) == ["s7", "s8", "s9"]
        mean = sum(record.test_by_group.values()) / 3
        assert mean == pytest.approx(record.test_accuracy)
    assert summarize(records, 1.0)["test_by_group"] == records[-1].test_by_group
    with pytest.raises(ValueError, match="no array 'user'"):
        grid = InProcessGrid(fleet(1), tmp_path / "b2", settings)
        try:
            run_rounds(grid, fast(eval_data=str(test), eval_group_by="user"))
        finally:
            grid.close()


def test_held_out_people_are_standardised_each_by_their_own_statistics(tmp_path: Path) -> None:
    # Prepare: 2 people whose sensors read on different scales (gain 1 and 50, bias 0 and 300)
    x, y = SensorTask().sample(200, np.random.default_rng(5))
    x[100:] = 50.0 * x[100:] + 300.0
    test = tmp_path / "test.npz"
    np.savez(test, x=x, y=y, subject=np.repeat(["a", "b"], 100))
    settings = RunSettings(preprocess="standardize", eval_data=str(test), eval_group_by="subject")
    task = Classification(preprocess="standardize")
    # Execute
    held_out = ServerEvaluation.from_settings(
        settings.evaluation, settings.learning, settings.seed, task
    )
    # Assert: each person's channels come out centred and of unit scale, as on their device
    assert held_out is not None and held_out.groups is not None
    for person in ("a", "b"):
        part = held_out.x[held_out.groups == person]
        assert np.abs(part.mean(axis=(0, 2))).max() < 0.05
        assert part.std(axis=(0, 2)) == pytest.approx(np.ones(part.shape[1]), abs=0.05)
