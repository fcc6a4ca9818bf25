"""Differential privacy: device sampling, clipping what is actually sent, the aggregator's
noise, adaptive clipping, what a device sends, and what DP refuses (the accountant and what
a private run publishes: ``test_privacy_accounting.py``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.aggregation import PrivateMean
from aggregator.privacy import Privacy
from aggregator.sampling import poisson_sample
from deploy.bench import privacy as bench_privacy
from edge_client.wire.clipping import l2_norm
from edge_client.wire.codec import FeedbackState, compress
from edge_client.wire.run_config import RunSettings
from edge_client.wire.settings_groups import PrivacySettings
from tests.privacy_runs import Fast, pin_secret_draws, private_run


@pytest.fixture(autouse=True)
def repeatable_secret_draws(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's draw pinned to a seed (:func:`tests.privacy_runs.pin_secret_draws`)."""
    pin_secret_draws(request, monkeypatch)


# -- bad input: one line each, before anything starts -----------------------------------


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"dp_clip": 0.0}, "dp-clip must be > 0"),
        ({"dp_noise": -1.0}, "dp-noise must be >= 0"),
        ({"dp_delta": 0.0}, "dp-delta must be in"),
        ({"dp_delta": 1.0}, "dp-delta must be in"),
        ({"dp_noise": 0.0}, "needs dp-noise > 0"),
        ({"inject_alpha": 0.25}, "raw samples would leave the device"),
        ({"aggregation": "fedavg"}, "needs aggregation = 'adaptive' or 'fednova'"),
        ({"aggregation": "krum"}, "needs aggregation = 'adaptive' or 'fednova'"),
        ({"mode": "async", "fraction_train": 1.0}, "sync mode only"),
        ({"drift_reaction": "boost"}, "drift-reaction = 'none'"),
        ({"compress": "adaptive"}, "refuses compress = 'adaptive'"),
        ({"dp": "local", "dp_clip_quantile": 0.5}, "works with dp = 'central' only"),
        ({"fraction_train": 0.0}, "fraction-train must be in"),
        ({"dp_device_scores": True}, "needs dp-device-records = true"),
    ],
)
def test_a_setting_dp_cannot_cover_is_refused_in_one_line(
    keys: dict[str, object], said: str
) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        RunSettings(**{"dp": "central", **keys})
    assert "\n" not in str(caught.value)


def test_privacy_and_injection_say_why_injection_is_refused() -> None:
    with pytest.raises(ValueError) as caught:
        RunSettings(dp="local", inject_alpha=0.1)
    assert "privacy" in str(caught.value) and "raw samples" in str(caught.value)


# -- device sampling ----------------------------------------------------------------------


def test_poisson_sampling_draws_each_device_with_the_fraction_and_repeats_for_a_seed() -> None:
    # Prepare: 200 devices, a quarter a round, 200 rounds
    devices = {1000 + i: f"dev-{i:03d}" for i in range(200)}
    # Execute
    drawn = [poisson_sample(devices, 0.25, seed=4, server_round=r) for r in range(1, 201)]
    again = poisson_sample(devices, 0.25, seed=4, server_round=7)
    # Assert: about q x n a round, sizes vary (Poisson, not a fixed count), every device
    # drawn about q of the rounds; the same draw for the same seed and round
    sizes = [len(d) for d in drawn]
    assert 45 < np.mean(sizes) < 55 and len(set(sizes)) > 5
    per_device = np.bincount([n - 1000 for d in drawn for n in d], minlength=200) / 200
    assert 0.2 < per_device.mean() < 0.3 and per_device.min() > 0.08
    assert again == drawn[6]
    assert poisson_sample(devices, 1.0, 4, 1) == list(devices)


def test_the_controller_plans_for_the_sampled_devices_only(tmp_path: Path, fast: Fast) -> None:
    # Execute: 8 devices, half drawn a round, no DP
    records, settings = private_run(
        tmp_path, fast, devices=8, dp="off", num_rounds=4, compress="none"
    )
    # Assert: each round's plan names the drawn devices, shares the whole global batch
    # between them, and they (and no others) replied; the rounds' draws differ
    for record in records:
        assert record.live == 8 and 0 < len(record.planned) < 8
        assert set(record.devices) == set(record.planned)
        assert record.sum_b == settings.global_batch
    assert len({tuple(sorted(r.planned)) for r in records}) > 1


# -- the device clips what it sends -------------------------------------------------------


@pytest.mark.parametrize("mode", ["topk", "int8", "fp16", "none"])
def test_the_sent_update_never_exceeds_the_clip_and_the_residual_stays_bounded(
    mode: str,
) -> None:
    # Prepare: 60 rounds of updates mostly far over the clip, carried by error feedback
    rng = np.random.default_rng(3)
    clip = 0.5
    state = FeedbackState()
    sent_norms, residual_norms, within, fits = [], [], [], []
    # Execute
    for r in range(60):
        scale = 0.001 if r % 5 == 0 else 3.0  # now and then one far within the clip
        delta = {
            "w": rng.normal(0, scale, (40, 25)).astype(np.float32),
            "b": rng.normal(0, scale, 25).astype(np.float32),
        }
        carried = state.residual or {k: np.zeros_like(v) for k, v in delta.items()}
        fits.append(l2_norm({k: v + carried[k] for k, v in delta.items()}) <= clip)
        packed = compress(delta, state, mode, 0.1, clip=clip)
        state = packed.state
        sent_norms.append(l2_norm(packed.sent))
        assert state.residual is not None
        residual_norms.append(l2_norm(state.residual))
        within.append(packed.within_clip)
    # Assert: what left never exceeds the clip, what was kept back never grows past it
    # (what clipping cut is dropped, not carried), and the report says which were clipped
    assert max(sent_norms) <= clip
    assert max(residual_norms) <= clip * 1.01
    assert within == fits and not all(within)
    if mode == "none":
        assert max(residual_norms) < 1e-6 and any(within)  # dense: nothing kept back


def test_local_dp_adds_noise_of_the_stated_size_on_the_device() -> None:
    # Prepare: a zero update (so what is sent is the noise), clip 0.5, noise 2
    zero = {"w": np.zeros((200, 100), np.float32)}
    # Execute
    packed = compress(zero, FeedbackState(), "none", clip=0.5, noise=2.0)
    # Assert: its standard deviation is noise x clip (20,000 values: within 2 %)
    assert np.std(packed.sent["w"]) == pytest.approx(1.0, rel=0.02)


# -- the aggregator: clipping again, noise, expected count -------------------------------


def test_the_central_noise_has_the_stated_magnitude_and_divides_by_the_expected_count() -> None:
    # Prepare: 10 devices each sending the same update of norm 0.3 (clip 0.5), noise 1.5,
    # 20 expected (q = 0.5 of 40 live)
    shapes = {"w": (300, 300)}
    # a seeded generator (a run's never is): the mean's test is within 1.6 standard errors
    mean = PrivateMean(shapes, clip=0.5, noise=1.5, expected=20.0, rng=np.random.default_rng(0))
    update = {"w": np.full((300, 300), 0.3 / 300, np.float32)}
    for i in range(10):
        mean.update(update, weight=99, device=f"dev-{i}", steps=7, boost=3.0)
    # Execute
    result = mean.result()
    # Assert: the mean is the sum over 20 (not over the 10 who came, and weights, steps and
    # boosts count for nothing); the noise's deviation is 1.5 x 0.5 / 20 (90,000 values)
    assert result is not None
    combined, devices = result
    assert len(devices) == 10
    assert float(np.mean(combined["w"])) == pytest.approx(10 * 0.001 / 20, abs=2e-4)
    assert float(np.std(combined["w"])) == pytest.approx(1.5 * 0.5 / 20, rel=0.02)


def test_an_update_over_the_clip_is_clipped_by_the_aggregator_and_counted() -> None:
    # Prepare: one device that did not clip (norm 5 against a clip of 1), noise tiny
    mean = PrivateMean({"w": (4,)}, clip=1.0, noise=1e-9, expected=1.0, rng=np.random.default_rng())
    # Execute
    mean.update({"w": np.array([3.0, 4.0, 0.0, 0.0], np.float32)}, 1, "dev-0")
    result = mean.result()
    # Assert: it weighs at most the clip
    assert result is not None
    assert l2_norm(result[0]) == pytest.approx(1.0, rel=1e-4)
    assert mean.clipped_here == 1


def test_adaptive_clipping_moves_the_clip_towards_the_quantile() -> None:
    # Prepare: 1,000 expected devices; all within the clip, then none
    privacy = Privacy(
        PrivacySettings(dp="central", dp_clip=1.0, dp_clip_quantile=0.5, dp_count_noise=1.0),
        fraction=1.0,
    )
    clips = []
    for within in (1000, 1000, 0, 0):
        accumulator = privacy.accumulator({"w": (2,)}, live=1000)
        assert accumulator is not None
        for i in range(1000):
            accumulator.count_within(i < within)
        # Execute
        privacy.after_round(accumulator)
        clips.append(privacy.clip)
    # Assert: down by exp(-0.2 x 0.5) while every update fits, up by exp(0.2 x 0.5) when
    # none does (the count's noise, 1 in 1,000, moves each step by about 2e-4 times a
    # standard normal, unseeded: 4e-4 over the four; 3e-3 is 7 of those, a step is 0.1)
    assert clips == pytest.approx([math.exp(-0.1), math.exp(-0.2), math.exp(-0.1), 1.0], rel=3e-3)
    assert privacy.rounds == 4


def test_adaptive_clipping_refuses_a_count_noise_that_leaves_the_update_none() -> None:
    privacy = Privacy(
        PrivacySettings(dp="central", dp_noise=1.0, dp_clip_quantile=0.5, dp_count_noise=0.4),
        fraction=1.0,
    )
    with pytest.raises(ValueError, match="dp-count-noise > 1 / \\(2 x dp-noise\\)"):
        privacy.accumulator({"w": (2,)}, live=10)


# -- the accountant, the record, the budget -----------------------------------------------


def test_under_local_dp_only_the_noised_update_is_computed_from_the_samples(
    tmp_path: Path, fast: Fast
) -> None:
    # Execute: local DP (each device noises its own update) and central DP, side by side
    shown = {"dp_device_records": True}  # the replies as the aggregator got them
    local, _ = private_run(
        tmp_path / "local", fast, num_rounds=2, dp="local", dp_noise=1.0, **shown
    )
    central, _ = private_run(tmp_path / "central", fast, num_rounds=2, **shown)
    # Assert: under local DP no reply carries the training loss, the within-the-clip bit
    # or a score (computed on the samples, not noised); under central DP the loss is there
    replies = [m for r in local for m in r.devices.values()]
    assert replies and all(math.isnan(m.train_loss) for m in replies)
    assert all(m.dp_within_clip == 0 and math.isnan(m.eval_metric) for m in replies)
    assert all(math.isfinite(m.train_loss) for r in central for m in r.devices.values())


def test_device_scores_are_off_under_dp_unless_asked_for(tmp_path: Path, fast: Fast) -> None:
    # Execute
    records = {"dp_device_records": True}
    hidden, _ = private_run(tmp_path / "a", fast, num_rounds=2, **records)
    shown, _ = private_run(tmp_path / "b", fast, num_rounds=2, dp_device_scores=True, **records)
    # Assert: no device's own score in its figures by default; the fleet's is kept
    assert hidden[0].devices
    assert all(math.isnan(m.eval_metric) for r in hidden for m in r.devices.values())
    assert all(math.isfinite(r.accuracy) for r in hidden)
    assert all(math.isfinite(m.eval_metric) for r in shown for m in r.devices.values())


def test_the_privacy_benchmark_judges_the_least_noise_within_the_epsilon_goal() -> None:
    # Prepare: two seeds; central-0.6 spends over 8, central-0.8 within, 0.3 points down in
    # one seed and 4 points in the other
    def arm(accuracy: float, epsilon: float | None) -> dict[str, Any]:
        return {
            "final_accuracy": accuracy,
            "dp_epsilon_spent": epsilon,
            "bytes_up_per_round": 1000.0,
            "wall_s_per_round": 1.0,
        }

    entries = [
        {
            "seed": s,
            "arms": {
                "no-dp": arm(0.90, None),
                "central-0.6": arm(0.89, 12.0),
                "central-0.8": arm(0.90 - drop, 6.7),
                "central-1": arm(0.80, 4.2),
            },
        }
        for s, drop in ((0, 0.003), (1, 0.04))
    ]
    # Execute
    table = bench_privacy._table(entries, devices=1000, rounds=20, quick=False)
    # Assert: the goal is read off central-0.8 and missed in the second seed
    assert "At epsilon <= 8 (central-0.8): +0.022 (+0.003-+0.040) below no-dp" in table
    assert "MISSED" in table
