"""Local epochs over a starved stream (``max-passes``): a device whose stream brought fewer
than ``b * K`` samples trains its steps over the ones it has, each at most P times."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from aggregator.round_log import RoundRecord, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.trainer import _epochs, train_local
from edge_client.task.models import build_model
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch
from edge_client.wire.records import RecordError, RoundPlan
from tests.unit.test_training import Fast, Fleet, step_time


@pytest.mark.parametrize(("fresh", "total"), [(150, 600), (7, 20), (5, 5), (98, 390)])
def test_passes_cover_every_fresh_sample_evenly(fresh: int, total: int) -> None:
    # Execute
    order = _epochs(np.random.default_rng(0), fresh, total)
    # Assert: `total` indices, each pass a permutation, each sample within one of another.
    counts = np.bincount(order, minlength=fresh)
    assert len(order) == total and counts.max() - counts.min() <= 1
    assert counts.sum() == total and counts.min() == total // fresh
    assert sorted(order[:fresh]) == list(range(fresh))


def test_one_pass_is_the_shuffle_of_one_epoch() -> None:
    # The order every run so far trained in (and the fingerprint records) is unchanged.
    assert list(_epochs(np.random.default_rng(3), 40, 40)) == list(
        np.random.default_rng(3).permutation(40)
    )


def _buffered(tmp_path: Path, n: int) -> tuple[BufferStore, nn.Module]:
    task = SensorTask()
    x, y = task.sample(n, np.random.default_rng(0), np.eye(6)[0])
    store = BufferStore(tmp_path / "b.sqlite", shape=task.shape)
    store.append([SampleBatch(x=x, y=y, ts=np.zeros(n))])
    return store, build_model("cnn", task.shape, 6, seed=0)


@pytest.mark.parametrize(
    ("buffered", "passes", "batch", "fresh", "left"),
    [
        (100, 4, 13, 100, 0),  # starved: 13 x 30 = 390 samples trained over the 100 there
        (100, 1, 3, 90, 10),  # one pass: the batch the samples allow, each sample once
        (700, 4, 20, 600, 100),  # the stream kept up: each of b x K samples once
    ],
)
def test_a_starved_device_trains_its_steps_over_the_samples_it_has(
    tmp_path: Path, buffered: int, passes: int, batch: int, fresh: int, left: int
) -> None:
    # Prepare: a plan of 30 steps at 20 (600 samples) against `buffered` samples.
    store, model = _buffered(tmp_path, buffered)
    plan = RoundPlan(20, 30, 0.05, wait_policy="adapt", b_min=2, max_passes=passes)
    # Execute
    with store:
        result = train_local(model, store, plan)
        remaining = store.fill
    # Assert: the steps trained b x K samples, the fresh ones among them each once or more,
    # scored once each (prequential), at the learning rate of the batch trained.
    assert result.batch_size == batch and result.num_examples == batch * 30
    assert result.fresh == fresh and remaining == left
    assert result.evaluated is not None and result.evaluated.count == fresh
    assert result.lr == pytest.approx(0.05 * batch / 20)


def test_a_plan_refuses_max_passes_out_of_range() -> None:
    with pytest.raises(ValueError, match="max-passes"):
        RoundPlan(20, 30, 0.05, max_passes=0)
    with pytest.raises(RecordError, match="max-passes"):
        RoundPlan.from_record({"batch-size": 20, "local-steps": 30, "lr": 0.05, "max-passes": 65})


def test_max_passes_raises_the_availability_cap_and_the_devices_reuse_their_samples(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: two starved devices (50 samples/s for a plan of B = 64 x K samples a
    # round), as in the single-pass test of the cap, allowed 4 passes.
    settings = fast(num_rounds=4, wait_policy="adapt", max_passes=4)
    grid = InProcessGrid(fleet(1, 1, rate=50, initial=100), tmp_path / "b", step_time=step_time)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    # Assert: from round 2 on each plan is capped at 4x what the buffer could have, and
    # each device trains over at most that: fewer fresh samples than it trains on.
    k = settings.local_steps
    reused = 0
    for prev, now in itertools.pairwise(records):
        for d, b in now.planned.items():
            can = prev.devices[d].buffer_fill + 50 * prev.virtual_s
            assert b * k <= max(4 * can, settings.b_min * k) + k, (now.round, d)
        for m in now.devices.values():
            assert m.fresh_samples is not None
            assert 0 < m.fresh_samples <= m.num_examples <= 4 * m.fresh_samples + k
            reused += m.fresh_samples < m.num_examples
    assert reused > 0


def test_min_fresh_samples_counts_a_sample_trained_twice_once(
    tmp_path: Path, fast: Fast, fleet: Fleet
) -> None:
    # Prepare: the starved fleet of the test above; its rounds train about twice as many
    # samples as they take fresh, and the run asks for a number of fresh samples between.
    settings = fast(num_rounds=4, wait_policy="adapt", max_passes=4)

    def run(name: str, min_fresh: int) -> list[RoundRecord]:
        devices = fleet(1, 1, rate=50, initial=100)
        grid = InProcessGrid(devices, tmp_path / name, step_time=step_time)
        return rounds_only(run_rounds(grid, replace(settings, min_fresh_samples=min_fresh)))

    def fresh(r: RoundRecord) -> int:
        return sum(m.fresh_samples or 0 for m in r.devices.values())

    second = run("a", 1)[1]  # round 2: trained on a capped plan
    trained = sum(m.num_examples for m in second.devices.values())
    threshold = (fresh(second) + trained) // 2
    assert fresh(second) < threshold <= trained
    # Execute
    records = run("b", threshold)
    # Assert: a round is skipped exactly when its fresh samples fall short, though the
    # samples it trained (repeats counted) would have been enough.
    assert [r.skipped == "too-few-fresh-samples" for r in records] == [
        fresh(r) < threshold for r in records
    ]
    assert records[1].skipped == "too-few-fresh-samples"
