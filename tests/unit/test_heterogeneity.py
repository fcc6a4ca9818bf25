"""The adaptive rule's estimate of how the devices' updates differ beyond sampling noise."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from aggregator.checkpoint import load_checkpoint
from aggregator.heterogeneity import (
    MAX_RATIO,
    SKETCH,
    Heterogeneity,
    PairMoments,
    adaptive_weight,
)
from aggregator.round_log import RoundRecord, rounds_only
from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from tests.helpers import Fast, fitted

DIM = 2000  # coordinates of the synthetic updates
SAMPLES = (160, 160, 460, 7800)  # a round at HL8: three slow devices and a fast one


def _round(rng: np.random.Generator, spread: float, noise: float) -> list[np.ndarray]:
    """One round's per-step updates: a shared direction, each device's own offset of squared
    norm ``spread`` (heterogeneity H) and sampling noise of squared norm ``noise / n``."""
    shared = rng.normal(size=DIM)
    out = []
    for n in SAMPLES:
        offset = rng.normal(size=DIM) * math.sqrt(spread / DIM)
        out.append(shared + offset + rng.normal(size=DIM) * math.sqrt(noise / n / DIM))
    return out


def _fast_share(ratio: float) -> float:
    """The fast device's share of the round's weight at ``ratio``."""
    weights = [adaptive_weight(n, ratio) for n in SAMPLES]
    return weights[-1] / sum(weights)


def _observe(het: Heterogeneity, updates: list[np.ndarray], samples=SAMPLES) -> None:
    pairs = PairMoments({"w": (DIM,)})
    for d, n in zip(updates, samples, strict=True):
        pairs.add({"w": d}, n)
    het.observe(pairs)


def test_pair_sums_equal_the_sums_over_every_pair() -> None:
    # Prepare: four updates of different sample counts.
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=5) for _ in SAMPLES]
    pairs = PairMoments({"w": (5,)})
    for d, n in zip(updates, SAMPLES, strict=True):
        pairs.add({"w": d}, n)
    # Execute
    sums = pairs.sums()
    # Assert: against the six pairs written out.
    x, y = [], []
    for i, j in itertools.combinations(range(len(SAMPLES)), 2):
        x.append(1 / SAMPLES[i] + 1 / SAMPLES[j])
        y.append(float(np.sum((updates[i] - updates[j]) ** 2)))
    xs, ys = np.array(x), np.array(y)
    assert sums is not None
    np.testing.assert_allclose(
        sums, [6, xs.sum(), (xs**2).sum(), ys.sum(), (xs * ys).sum()], rtol=1e-12
    )


def test_a_large_model_is_sketched_to_the_same_ratio() -> None:
    # Prepare: a model of 50,000 values (over SKETCH) in two tensors, skewed updates.
    shapes = {"w": (200, 200), "b": (10_000,)}
    rng = np.random.default_rng(6)
    sketched, whole = Heterogeneity(), Heterogeneity()
    # Execute: the same ten rounds, sketched and over every coordinate.
    for _ in range(10):
        shared = {k: rng.normal(size=s) for k, s in shapes.items()}
        updates = []
        for n in SAMPLES:
            updates.append(
                {
                    k: shared[k]
                    + rng.normal(size=s) * math.sqrt(5.0 / 50_000)
                    + rng.normal(size=s) * math.sqrt(1000.0 / n / 50_000)
                    for k, s in shapes.items()
                }
            )
        for het, size in ((sketched, SKETCH), (whole, 10**9)):
            pairs = PairMoments(shapes, sketch=size)
            for d, n in zip(updates, SAMPLES, strict=True):
                pairs.add(d, n)
            het.observe(pairs)
    # Assert: the sketch holds SKETCH values, and its ratio is the whole model's (r = 200).
    assert PairMoments(shapes).coordinates == SKETCH
    assert sketched.ratio() == pytest.approx(whole.ratio(), rel=0.15)
    assert 100 < whole.ratio() < 400


def test_one_update_makes_no_pair() -> None:
    pairs = PairMoments({"w": (2,)})
    pairs.add({"w": np.ones(2)}, 10)
    assert pairs.sums() is None


def test_alike_streams_lead_to_sample_weights() -> None:
    # Prepare: IID streams, updates that differ by sampling noise only.
    rng = np.random.default_rng(1)
    het = Heterogeneity()
    # Execute: ten rounds.
    for _ in range(10):
        _observe(het, _round(rng, spread=0.0, noise=1000.0))
    # Assert: the fast device's share of the weight is near its share of the samples (0.91),
    # far from the equal share (0.25).
    assert _fast_share(het.ratio()) > 0.85


def test_skewed_streams_lead_to_equal_weights() -> None:
    # Prepare: label skew, each device's own direction well above its noise.
    rng = np.random.default_rng(2)
    het = Heterogeneity()
    # Execute
    for _ in range(10):
        _observe(het, _round(rng, spread=5.0, noise=1000.0))
    # Assert: r = S / H = 200 samples, within the noise of ten rounds; the fast device's
    # share is then 0.38 (0.25 equal, 0.91 by samples).
    assert 100 < het.ratio() < 400
    assert _fast_share(het.ratio()) < 0.45


def test_the_estimate_does_not_depend_on_the_updates_scale() -> None:
    # Prepare: the same rounds, once as they are and once 1000x smaller (a converged model's).
    rounds = [_round(np.random.default_rng(3 + i), spread=5.0, noise=1000.0) for i in range(6)]
    big, small = Heterogeneity(), Heterogeneity()
    # Execute
    for updates in rounds:
        _observe(big, updates)
        _observe(small, [u / 1000 for u in updates])
    # Assert
    assert small.ratio() == pytest.approx(big.ratio(), rel=1e-9)


def test_equal_samples_give_no_slope_and_equal_weights() -> None:
    # Prepare: every device trained the same number of samples, round after round.
    rng = np.random.default_rng(4)
    het = Heterogeneity()
    # Execute
    for _ in range(5):
        _observe(het, _round(rng, spread=0.0, noise=1000.0)[:3], samples=(100, 100, 100))
    # Assert
    assert het.fit() is None
    assert het.ratio() == 0.0


def test_ratio_ends_and_weights() -> None:
    # Prepare / Execute / Assert: no fit yet, no noise, no heterogeneity, and a fitted r.
    assert Heterogeneity().ratio() == 0.0
    assert fitted(h=1.0, s=-5.0).ratio() == 0.0
    assert fitted(h=0.0, s=5.0).ratio() == MAX_RATIO
    assert fitted(h=2.0, s=300.0).ratio() == pytest.approx(150.0)
    assert adaptive_weight(160, 0.0) == 1.0
    assert adaptive_weight(160, 480.0) == pytest.approx(0.25)


def test_state_survives_a_checkpoint() -> None:
    # Prepare: an estimate after three rounds.
    rng = np.random.default_rng(5)
    het = Heterogeneity()
    for _ in range(3):
        _observe(het, _round(rng, spread=1.0, noise=1000.0))
    # Execute: saved and loaded, as a resumed run does.
    again = Heterogeneity()
    again.load_state_dict(het.state_dict())
    # Assert
    assert again.ratio() == het.ratio() and again.rounds == 3


@pytest.mark.parametrize(
    "state",
    [{"sums": [1, 2, 3], "scale": 1.0, "rounds": 1}, {"sums": [1, 2, 3, 4, math.nan]}],
)
def test_a_damaged_state_is_refused(state: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="5 finite sums"):
        Heterogeneity().load_state_dict(state)


def test_decay_is_checked() -> None:
    with pytest.raises(ValueError, match="decay"):
        Heterogeneity(decay=1.0)


# -- in a run: what the estimate does round by round, and across a resume ---------------


def test_a_resumed_run_weighs_as_the_run_it_continues(tmp_path: Path, fast: Fast) -> None:
    # Prepare: three devices of different speeds (so their batches and sample counts differ)
    # and an exact step cost, so that two runs of the same settings are identical.
    def step_time(b: int) -> float:
        return 0.001 + 1e-5 * b

    def fleet() -> list[VirtualDevice]:
        return [VirtualDevice(f"dev-{i}", slowdown=s) for i, s in enumerate((1, 2, 4))]

    def rounds(directory: str, n: int, resume: bool) -> list[RoundRecord]:
        grid = InProcessGrid(fleet(), tmp_path / directory, step_time=step_time)
        try:
            settings = fast(num_rounds=n, checkpoint_dir=str(tmp_path / f"c{directory}"))
            return run_rounds(grid, replace(settings, resume=resume) if resume else settings)
        finally:
            grid.close()

    # Execute: 5 rounds straight; 3 rounds, a new aggregator, resumed for 2 more.
    straight = rounds("a", 5, False)
    rounds("b", 3, False)
    resumed = rounds("b", 5, True)
    # Assert: the estimate was learnt (a ratio above 0 after round 1) and carried over, so
    # the resumed rounds weigh as the straight run's, to the model's last bit.
    ratios = [r.weight_ratio for r in rounds_only(straight)]
    assert ratios[0] == 0.0 and all(r is not None and r > 0 for r in ratios[1:])
    assert [r.weight_ratio for r in rounds_only(resumed)] == ratios[3:]
    a, b = load_checkpoint(tmp_path / "ca"), load_checkpoint(tmp_path / "cb")
    assert a is not None and b is not None
    wa, wb = a.arrays.to_torch_state_dict(), b.arrays.to_torch_state_dict()
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)
