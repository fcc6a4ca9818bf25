"""The controller balances a device's whole round: its steps and the prequential scoring of
their samples (each sample a step trains on is scored once before training)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from aggregator.controller import BatchController
from edge_client.runtime.trainer import probe_step_times
from edge_client.task.interface import EVAL_CHUNK
from edge_client.wire.records import ReplyMetrics
from edge_client.wire.run_config import ControllerSettings


def _reply(batch: int, step_s: float, eval_s: float, eval_count: int) -> ReplyMetrics:
    return ReplyMetrics(
        num_examples=batch * 10,
        batch_size=batch,
        step_s=step_s,
        train_loss=1.0,
        eval_s=eval_s,
        eval_count=eval_count,
    )


def test_a_reply_charges_each_step_with_the_scoring_of_its_samples() -> None:
    # Prepare: a spread round (16 and 48 a step) that scored 640 samples in 0.32 s
    reply = ReplyMetrics(
        num_examples=320, batch_size=32, step_s=0.004, train_loss=1.0, eval_s=0.32,
        eval_count=640, step_batches=[16, 48], step_times=[0.002, 0.006],
    )  # fmt: skip
    # Execute
    costs = reply.costs()
    # Assert: 0.5 ms a sample, batch samples a step
    assert [b for b, _ in costs] == [16, 48]
    assert [t for _, t in costs] == pytest.approx([0.010, 0.030])


@pytest.mark.parametrize(
    ("eval_s", "eval_count"), [(0.0, 320), (0.5, 0), (math.nan, 320), (-1.0, 320)]
)
def test_a_reply_without_a_scoring_time_gives_its_step_times(
    eval_s: float, eval_count: int
) -> None:
    reply = _reply(32, 0.004, eval_s, eval_count)
    assert reply.costs() == reply.timings() == [(32, 0.004)]


def test_a_device_that_scores_slowly_gets_a_smaller_batch() -> None:
    # Prepare: equal steps (0.1 ms a sample), but d1 scores a sample in 0.1 ms and d0 in
    # none: a round costs d1 twice what it costs d0 per sample of its batch
    ctrl = BatchController(ControllerSettings(global_batch=300, b_min=4, b_max=300))
    for batch in (50, 150):
        for device, eval_s in (("d0", 0.0), ("d1", batch * 10 * 1e-4)):
            reply = _reply(batch, batch * 1e-4, eval_s, batch * 10)
            for b, seconds in reply.costs():
                ctrl.observe(device, b, seconds)
    # Execute
    plan = ctrl.plan(["d0", "d1"], 2)
    # Assert: batches 2:1, so that both rounds (steps and scoring) take as long
    assert plan.batches == {"d0": 200, "d1": 100}


class _SlowScoring(nn.Module):
    """A linear model whose every forward pass in eval mode (scoring) sleeps ``pause``."""

    def __init__(self, pause: float) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.pause = pause

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            time.sleep(self.pause)
        out: torch.Tensor = self.linear(x.flatten(1))
        return out


def test_the_probe_times_a_step_with_the_scoring_of_its_samples() -> None:
    # Prepare: scoring a chunk takes 100 ms; the steps themselves take well under a ms
    model = _SlowScoring(0.1)
    batches = [EVAL_CHUNK, 4 * EVAL_CHUNK]
    # Execute
    times = probe_step_times(model, (8,), 3, batches, 1)
    # Assert: each batch's time holds its samples' scoring once (100 ms, then 400 ms): at
    # least that, and short of twice that (a starved machine adds its wake-ups: +40 ms seen)
    assert 0.1 <= times[0] < 0.19
    assert 0.4 <= times[1] < 0.75
    assert model.training  # the probe leaves the model as it found it
