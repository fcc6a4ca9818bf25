"""A round that times two step sizes: the controller's slope without an extra exchange."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aggregator.controller import SLOPE_SPREAD, BatchController
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.trainer import step_sizes, train_local
from edge_client.task.models import build_model
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch
from edge_client.wire.records import ReplyMetrics, RoundPlan
from edge_client.wire.run_config import ControllerSettings


@pytest.mark.parametrize(("batch", "steps"), [(32, 6), (32, 7), (5, 4), (64, 40)])
def test_spread_steps_train_the_planned_samples_at_two_sizes(batch: int, steps: int) -> None:
    # Execute
    sizes = step_sizes(batch, steps, 0.5)
    # Assert: b * K samples either way; the timed steps (all but the first) hold both sizes
    assert sum(sizes) == batch * steps and len(sizes) == steps
    low, high = min(sizes), max(sizes)
    assert low < batch < high and low + high == 2 * batch
    assert {low, high} <= set(sizes[1:])


@pytest.mark.parametrize(("batch", "steps", "spread"), [(32, 3, 0.5), (1, 10, 0.5), (32, 8, 0)])
def test_no_spread_where_it_cannot_time_two_sizes(batch: int, steps: int, spread: float) -> None:
    assert step_sizes(batch, steps, spread) == [batch] * steps


def test_a_spread_round_consumes_the_plan_and_times_both_sizes(tmp_path: Path) -> None:
    # Prepare: 20 x 8 samples buffered, a plan of 8 steps at 20 with a spread of 0.5
    task = SensorTask()
    x, y = task.sample(200, np.random.default_rng(0), np.eye(6)[0])
    model = build_model("cnn", task.shape, 6, seed=0)
    with BufferStore(tmp_path / "b.sqlite", shape=task.shape) as store:
        store.append([SampleBatch(x=x, y=y, ts=np.zeros(200))])
        # Execute
        result = train_local(model, store, RoundPlan(20, 8, 0.05, time_spread=0.5))
        left = store.fill
    # Assert: the planned samples were taken once; each size has its own time, the step
    # time reported is theirs averaged (the time at the batch, for a linear cost)
    assert result.num_examples == 160 and left == 40
    assert [b for b, _ in result.step_timings] == [10, 30]
    times = [t for _, t in result.step_timings]
    assert all(t > 0 for t in times)
    assert result.step_s == pytest.approx(sum(times) / 2)


def test_a_plan_refuses_a_spread_of_one_or_more() -> None:
    with pytest.raises(ValueError, match="time-spread"):
        RoundPlan(20, 8, 0.05, time_spread=1.0)


def test_the_controller_asks_for_a_spread_until_it_knows_two_sizes() -> None:
    # Prepare
    ctrl = BatchController(ControllerSettings(global_batch=64, b_min=4, b_max=64))
    fixed = BatchController(
        ControllerSettings(global_batch=64, b_min=4, b_max=64, controller="fixed")
    )
    # Execute / Assert: a newcomer, and a device timed at one size, are asked for it
    assert ctrl.time_spread("d0") == SLOPE_SPREAD
    ctrl.observe("d0", 32, 0.0042)
    assert ctrl.time_spread("d0") == SLOPE_SPREAD
    # a spread round's reply: two sizes, and the cost model has its slope (t = 1 ms + 0.1 ms b)
    reply = ReplyMetrics(
        num_examples=192, batch_size=32, step_s=0.0042, train_loss=1.0,
        step_batches=[16, 48], step_times=[0.0026, 0.0058],
    )  # fmt: skip
    for batch, seconds in reply.timings():
        ctrl.observe("d0", batch, seconds)
    assert ctrl.time_spread("d0") == 0.0
    a, c = ctrl.devices["d0"].cost_model(0.0) or (0.0, 0.0)
    assert a == pytest.approx(1e-3, rel=0.05) and c == pytest.approx(1e-4, rel=0.05)
    assert fixed.time_spread("d0") == 0.0  # the fixed split does not need a slope


def test_a_reply_without_a_spread_reports_its_one_timing() -> None:
    plain = ReplyMetrics(num_examples=64, batch_size=32, step_s=0.004, train_loss=1.0)
    idle = ReplyMetrics(num_examples=0, batch_size=0, step_s=0.0, train_loss=float("nan"))
    assert plain.timings() == [(32, 0.004)]
    assert idle.timings() == []
