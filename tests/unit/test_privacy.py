"""Differential privacy: device sampling, clipping what is actually sent, the aggregator's
noise, adaptive clipping, the accountant and the budget, and what DP refuses."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from flwr.app import ConfigRecord

from aggregator import sampling
from aggregator.aggregation import PrivateMean
from aggregator.exchange import exchange
from aggregator.privacy import Privacy, PrivacyBudgetError
from aggregator.prometheus_sink import RoundExporter
from aggregator.round_log import RoundRecord, read_metrics, rounds_only
from aggregator.sampling import poisson_sample
from aggregator.server_app import run_rounds
from aggregator.session import RunSession
from deploy.bench import privacy as bench_privacy
from deploy.demo_view import progress_table
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import free_port
from deploy.report import summarize
from edge_client.wire.clipping import l2_norm
from edge_client.wire.codec import FeedbackState, compress
from edge_client.wire.run_config import RunSettings
from edge_client.wire.settings_groups import PrivacySettings

Fast = Callable[..., RunSettings]

#: A private run's keys: central DP, half the fleet a round, compressed updates.
PRIVATE = {
    "dp": "central",
    "dp_clip": 0.5,
    "dp_noise": 0.8,
    "fraction_train": 0.5,
    "compress": "topk",
    "controller_probe": 0,
}


#: The seeded generator the tests put in place of the secret draw's (see the fixture).
SECRET_DRAW_SEED = 11


def library_epsilon(fraction: float, noise: float, rounds: int, delta: float) -> float:
    """What Google's RDP accountant says, computed here apart from fedstream's."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    event = dp_event.PoissonSampledDpEvent(fraction, dp_event.GaussianDpEvent(noise))
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(delta))


@pytest.fixture(autouse=True)
def repeatable_secret_draws(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DP the draw of a round's devices is secret (the OS's entropy): these tests pin
    it to a seeded generator, so that their rounds repeat (none drawn empty), except where a
    test is about the secret draw itself."""
    if "secret_draw" in request.keywords:
        return
    rng = np.random.default_rng(SECRET_DRAW_SEED)
    monkeypatch.setattr(sampling, "secret_rng", lambda: rng)


def private_run(
    tmp_path: Path, fast: Fast, devices: int = 6, **keys: Any
) -> tuple[list[RoundRecord], RunSettings]:
    settings = fast(**{**PRIVATE, "out_dir": str(tmp_path / "out"), **keys})
    grid = InProcessGrid(
        [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(devices)],
        tmp_path / "buffers",
    )
    try:
        return rounds_only(run_rounds(grid, settings)), settings
    finally:
        grid.close()


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


@pytest.mark.secret_draw
def test_under_dp_two_runs_of_one_seed_draw_different_devices(tmp_path: Path, fast: Fast) -> None:
    # Execute: the same seeded private run twice, 8 devices, half drawn a round
    first, _ = private_run(tmp_path / "a", fast, devices=8, num_rounds=3)
    second, _ = private_run(tmp_path / "b", fast, devices=8, num_rounds=3)
    # Assert: the draws are not the seed's (the seed is in the run config, which is no
    # secret): they differ between the runs (the chance that 3 rounds of 8 coin flips
    # repeat is 2^-24)
    assert [sorted(r.planned) for r in first] != [sorted(r.planned) for r in second]


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
    # none does (the count's noise, 1 in 1,000, moves it by about 1e-4)
    assert clips == pytest.approx([math.exp(-0.1), math.exp(-0.2), math.exp(-0.1), 1.0], rel=1e-3)
    assert privacy.rounds == 4


@pytest.mark.parametrize("expected", [20, 100])
def test_adaptive_clippings_two_releases_together_are_the_accounted_multiplier(
    expected: int,
) -> None:
    # Prepare: central DP at noise 1 with adaptive clipping, the count's noise the default
    z = 1.0
    privacy = Privacy(PrivacySettings(dp="central", dp_noise=z, dp_clip_quantile=0.5), 1.0)
    accumulator = privacy.accumulator({"w": (2,)}, live=expected)
    assert accumulator is not None
    for i in range(expected):
        accumulator.count_within(i % 3 == 0)
    # Execute: the released count's sensitivity, measured by adding one device that fits
    # and one that does not (add/remove adjacency)
    base = accumulator.centred_count()
    moves = []
    for fits in (True, False):
        neighbour = privacy.accumulator({"w": (2,)}, live=expected)
        assert neighbour is not None
        for i in range(expected):
            neighbour.count_within(i % 3 == 0)
        neighbour.count_within(fits)
        moves.append(abs(neighbour.centred_count() - base))
    # Assert: it moves by 1/2 at most; with the update's noise (sensitivity the clip) the
    # two Gaussian releases compose to multiplier z exactly, what the accountant counts
    sensitivity = max(moves)
    assert sensitivity == 0.5
    sigma_count = expected / 20
    combined = (accumulator.noise**-2 + (sigma_count / sensitivity) ** -2) ** -0.5
    assert combined == pytest.approx(z, rel=1e-12)


def test_adaptive_clipping_refuses_a_count_noise_that_leaves_the_update_none() -> None:
    privacy = Privacy(
        PrivacySettings(dp="central", dp_noise=1.0, dp_clip_quantile=0.5, dp_count_noise=0.4),
        fraction=1.0,
    )
    with pytest.raises(ValueError, match="dp-count-noise > 1 / \\(2 x dp-noise\\)"):
        privacy.accumulator({"w": (2,)}, live=10)


# -- the accountant, the record, the budget -----------------------------------------------


def test_a_runs_epsilon_is_the_librarys_for_its_fraction_noise_rounds_and_delta(
    tmp_path: Path, fast: Fast
) -> None:
    # Execute: 4 rounds of central DP over 6 devices, half drawn a round
    records, settings = private_run(tmp_path, fast, num_rounds=4)
    logged = rounds_only(read_metrics(tmp_path / "out" / "metrics.jsonl"))
    # Assert: after each round, what Google's accountant gives for that many rounds; the
    # log holds it under dp-epsilon-spent and no other key holds "epsilon"
    expected = [library_epsilon(0.5, 0.8, r, 1e-5) for r in (1, 2, 3, 4)]
    assert [r.dp_epsilon_spent for r in records] == pytest.approx(expected, rel=1e-9)
    assert [r.dp_epsilon_spent for r in logged] == pytest.approx(expected, rel=1e-9)
    line = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1]
    assert line.count("epsilon") == 1 and '"dp-epsilon-spent"' in line
    assert all(r.dp_clip == settings.dp_clip for r in records)


def test_under_local_dp_only_the_noised_update_is_computed_from_the_samples(
    tmp_path: Path, fast: Fast
) -> None:
    # Execute: local DP (each device noises its own update) and central DP, side by side
    local, _ = private_run(tmp_path / "local", fast, num_rounds=2, dp="local", dp_noise=1.0)
    central, _ = private_run(tmp_path / "central", fast, num_rounds=2)
    # Assert: under local DP no reply carries the training loss, the within-the-clip bit
    # or a score (computed on the samples, not noised); under central DP the loss is there
    replies = [m for r in local for m in r.devices.values()]
    assert replies and all(math.isnan(m.train_loss) for m in replies)
    assert all(m.dp_within_clip == 0 and math.isnan(m.eval_metric) for m in replies)
    assert all(math.isfinite(m.train_loss) for r in central for m in r.devices.values())


def test_device_scores_are_off_under_dp_unless_asked_for(tmp_path: Path, fast: Fast) -> None:
    # Execute
    hidden, _ = private_run(tmp_path / "a", fast, num_rounds=2)
    shown, _ = private_run(tmp_path / "b", fast, num_rounds=2, dp_device_scores=True)
    # Assert: no device's own score in the records by default; the fleet's is kept
    assert all(math.isnan(m.eval_metric) for r in hidden for m in r.devices.values())
    assert all(math.isfinite(r.accuracy) for r in hidden)
    assert all(math.isfinite(m.eval_metric) for r in shown for m in r.devices.values())


def test_the_budget_ends_a_continuous_run_cleanly_and_a_resume_is_refused(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: a budget that pays for exactly 3 rounds; a continuous run, checkpointed and
    # exported
    budget = (library_epsilon(0.5, 0.8, 3, 1e-5) + library_epsilon(0.5, 0.8, 4, 1e-5)) / 2
    keys: dict[str, Any] = {
        "num_rounds": 0,
        "dp_epsilon": budget,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "export_dir": str(tmp_path / "models"),
    }
    # Execute
    records, _ = private_run(tmp_path, fast, **keys)
    # Assert: it stopped after round 3, within the budget, checkpointed and exported
    assert [r.round for r in records] == [1, 2, 3]
    assert records[-1].dp_epsilon_spent is not None
    assert records[-1].dp_epsilon_spent <= budget
    assert (tmp_path / "ckpt").is_dir()
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "models").rglob("manifest.json")]
    assert max(m["round"] for m in manifests) == 3
    assert max(m["dp-epsilon-spent"] for m in manifests) == records[-1].dp_epsilon_spent
    # Execute / Assert: resuming with the budget spent is refused before anything, in a line
    with pytest.raises(PrivacyBudgetError, match=r"dp-epsilon .* is spent: round 4") as caught:
        private_run(tmp_path / "again", fast, **{**keys, "resume": True})
    assert "\n" not in str(caught.value)


def test_the_accountant_continues_across_a_resume(tmp_path: Path, fast: Fast) -> None:
    # Prepare: 2 rounds checkpointed
    keys: dict[str, Any] = {"num_rounds": 2, "checkpoint_dir": str(tmp_path / "ckpt")}
    private_run(tmp_path / "first", fast, **keys)
    # Execute: resumed to 4 rounds
    resumed, _ = private_run(tmp_path / "second", fast, **{**keys, "num_rounds": 4, "resume": True})
    # Assert: rounds 3 and 4 count the 2 before them
    assert [r.round for r in resumed] == [3, 4]
    assert resumed[-1].dp_epsilon_spent == pytest.approx(library_epsilon(0.5, 0.8, 4, 1e-5))


def library_composition(*parts: tuple[float, float, int]) -> float:
    """Google's accountant over rounds of (q, z, count), at delta 1e-5, computed apart."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    for q, z, count in parts:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), count)
    return float(accountant.get_epsilon(1e-5))


@pytest.mark.parametrize(
    "changed",
    [{"dp_noise": 1.6}, {"fraction_train": 0.25}, {"dp_noise": 0.6, "fraction_train": 1.0}],
)
def test_a_resume_with_other_settings_composes_each_round_as_it_ran(
    tmp_path: Path, fast: Fast, changed: dict[str, Any]
) -> None:
    # Prepare: 2 rounds at noise 0.8 and half the fleet, checkpointed
    keys: dict[str, Any] = {"num_rounds": 2, "checkpoint_dir": str(tmp_path / "ckpt")}
    private_run(tmp_path / "first", fast, **keys)
    # Execute: resumed to 4 rounds with another noise or sampling rate
    again = {**keys, **changed, "num_rounds": 4, "resume": True}
    resumed, _ = private_run(tmp_path / "second", fast, devices=8, **again)
    # Assert: the first 2 rounds as they ran, the next 2 as they run now
    q, z = changed.get("fraction_train", 0.5), changed.get("dp_noise", 0.8)
    expected = library_composition((0.5, 0.8, 2), (q, z, 2))
    assert [r.round for r in resumed] == [3, 4]
    assert resumed[-1].dp_epsilon_spent == pytest.approx(expected, rel=1e-9)
    assert expected != pytest.approx(library_epsilon(q, z, 4, 1e-5), rel=1e-3)  # it matters


def test_dp_turned_on_over_rounds_that_ran_without_it_is_refused(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: 2 rounds without DP, checkpointed
    keys: dict[str, Any] = {"num_rounds": 2, "checkpoint_dir": str(tmp_path / "ckpt")}
    private_run(tmp_path / "first", fast, **{**keys, "dp": "off", "compress": "none"})
    # Execute / Assert: resumed under DP: no epsilon holds for those rounds' models
    with pytest.raises(PrivacyBudgetError, match="ran without it"):
        private_run(tmp_path / "second", fast, **{**keys, "num_rounds": 4, "resume": True})


def test_a_budget_too_small_for_one_round_is_refused_at_start(tmp_path: Path, fast: Fast) -> None:
    with pytest.raises(PrivacyBudgetError, match="round 1 would make it"):
        private_run(tmp_path, fast, num_rounds=3, dp_epsilon=0.01)


def test_privacy_state_round_trips() -> None:
    settings = PrivacySettings(dp="central")
    events = [("central", 0.1, 1.0)] * 3 + [("central", 0.2, 1.5)] * 2
    privacy = replace(Privacy(settings, 0.1), clip=0.7, rounds=5, history=events)
    back = Privacy.from_state(settings, 0.1, privacy.state_dict(), 5)
    assert (back.clip, back.rounds, back.history) == (0.7, 5, events)
    # a checkpoint from before the events were kept: its rounds count as this run's
    old = Privacy.from_state(settings, 0.1, {"rounds": 2, "clip": 0.7}, 2)
    assert old.history == [("central", 0.1, 1.0)] * 2


def test_the_epsilon_spent_is_in_the_live_table_the_summary_and_prometheus(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: a private run's records
    records, _ = private_run(tmp_path, fast, num_rounds=2)
    spent = records[-1].dp_epsilon_spent
    assert spent is not None
    exporter = RoundExporter(free_port(), listen="127.0.0.1")
    try:
        # Execute
        exporter.write(records[-1])
        gauge = exporter.registry.get_sample_value("fedstream_dp_epsilon_spent")
    finally:
        exporter.close()
    title = progress_table(records, 2, "final").title
    summary = summarize(records, 1.0)
    # Assert
    assert gauge == pytest.approx(spent)
    assert f"epsilon {spent:.2f} spent" in str(title)
    assert summary["dp_epsilon_spent"] == spent
    assert summary["dp_epsilon_spent_per_round"] == [r.dp_epsilon_spent for r in records]


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


def test_under_central_dp_a_round_without_updates_still_releases_the_noise(
    tmp_path: Path, fast: Fast
) -> None:
    # Prepare: central DP, every device drawn (q = 1) and every one failing in round 1
    settings = fast(**{**PRIVATE, "fraction_train": 1.0, "compress": "none", "num_rounds": 1})
    devices = [VirtualDevice(f"dev-{i}", rate=20_000, fail_rounds={1}) for i in range(4)]
    grid = InProcessGrid(devices, tmp_path / "buffers", settings)
    try:
        session = RunSession.open(settings)
        strategy = session.strategy
        messages = list(strategy.configure_train(1, session.arrays, ConfigRecord(), grid))
        done = exchange(grid, messages, 60)
        # Execute
        arrays, report = strategy.aggregate_train(1, done.replies, done.sent)
    finally:
        grid.close()
    # Assert: no update came, yet the round released the noised mean (noise x clip over the
    # 4 expected devices), is not skipped, and the accountant counted it
    assert not report.aggregated and len(report.failed) == 4
    assert arrays is not None and session.skip_reason(report) == ""
    moved = np.concatenate(
        [(arrays[k].numpy() - session.arrays[k].numpy()).ravel() for k in session.arrays]
    )
    assert moved.std() == pytest.approx(0.8 * 0.5 / 4, rel=0.05)
    assert strategy.privacy.rounds == 1
