"""Differential privacy's accounting and what a private run publishes: every release
counted (adaptive clipping's count, empty rounds), resumes composing each round as it ran,
the secret draw, the budget, and records that name no device unless the operator opts in."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from flwr.app import ConfigRecord

from aggregator.exchange import exchange
from aggregator.privacy import Privacy, PrivacyBudgetError
from aggregator.prometheus_sink import RoundExporter
from aggregator.round_log import read_metrics, rounds_only
from aggregator.session import RunSession
from deploy.demo_view import progress_table
from deploy.inprocess import InProcessGrid, VirtualDevice
from deploy.local import free_port
from deploy.report import summarize
from edge_client.wire.settings_groups import PrivacySettings
from tests.privacy_runs import PRIVATE, Fast, library_epsilon, pin_secret_draws, private_run


@pytest.fixture(autouse=True)
def repeatable_secret_draws(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's draw pinned to a seed (:func:`tests.privacy_runs.pin_secret_draws`)."""
    pin_secret_draws(request, monkeypatch)


@pytest.mark.secret_draw
def test_under_dp_two_runs_of_one_seed_draw_different_devices(tmp_path: Path, fast: Fast) -> None:
    # Execute: the same seeded private run twice, 8 devices, half drawn a round
    # (publishing who was drawn, dp-device-records, is how the test sees the draws)
    shown = {"devices": 8, "num_rounds": 3, "dp_device_records": True}
    first, _ = private_run(tmp_path / "a", fast, **shown)
    second, _ = private_run(tmp_path / "b", fast, **shown)
    # Assert: the draws are not the seed's (the seed is in the run config, which is no
    # secret): they differ between the runs (the chance that 3 rounds of 8 coin flips
    # repeat is 2^-24)
    assert [sorted(r.planned) for r in first] != [sorted(r.planned) for r in second]


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


# -- what a private run publishes ----------------------------------------------------------


def test_metrics_jsonl_under_dp_holds_no_device_id(tmp_path: Path, fast: Fast) -> None:
    # Prepare / Execute: the same 3 rounds with and without DP, with the timing probe
    keys: dict[str, Any] = {"num_rounds": 3, "controller_probe": 1, "devices": 6}
    private, _ = private_run(tmp_path / "dp", fast, **keys)
    plain, _ = private_run(tmp_path / "plain", fast, **keys, dp="off")
    published = (tmp_path / "dp" / "out" / "metrics.jsonl").read_text()
    exporter = RoundExporter(free_port(), listen="127.0.0.1")
    try:
        exporter.write(private[-1])
        labels = {
            s.labels.get("device") for metric in exporter.registry.collect() for s in metric.samples
        }
    finally:
        exporter.close()
    table = progress_table(private, 3, "final")
    summary = json.dumps(summarize(private, 1.0))
    # Assert: no line of the private run's log (the probe's included), no Prometheus label,
    # no row or caption of the live table and nothing in the summary names a device; the
    # plain run's log does (what the check looks for is there to find)
    assert "dev-" in (tmp_path / "plain" / "out" / "metrics.jsonl").read_text()
    assert len(published.splitlines()) == 4 and "dev-" not in published
    assert labels == {None}
    assert table.row_count == 0 and "dev-" not in str(table.title)
    assert "dev-" not in summary
    # ... yet each round's counts are there, as integers, the same as without DP's
    logged = rounds_only(read_metrics(tmp_path / "dp" / "out" / "metrics.jsonl"))
    for record in logged:
        assert record.devices_hidden and not record.planned and not record.devices
        counts = (record.planned_count, record.replied_count, record.aggregated_count)
        assert all(isinstance(c, int) for c in counts)
        assert 0 < record.aggregated_count <= record.replied_count <= record.planned_count <= 6
    assert [r.planned_count for r in plain] == [len(r.planned) for r in plain]
    assert f"{logged[-1].replied_count} of {logged[-1].planned_count} devices replied" in str(
        table.title
    )


def test_published_participation_is_accounted_without_amplification(
    tmp_path: Path, fast: Fast
) -> None:
    # Execute: half the fleet a round, its devices published (dp-device-records)
    records, _ = private_run(tmp_path, fast, num_rounds=3, dp_device_records=True)
    # Assert: the records name the devices, and the epsilon is the accountant's for q = 1
    # (whoever reads the records knows who was drawn): more than q = 0.5 would state
    assert all(r.planned and not r.devices_hidden for r in records)
    spent = records[-1].dp_epsilon_spent
    assert spent is not None
    assert spent == pytest.approx(library_epsilon(1.0, 0.8, 3, 1e-5))
    assert spent > library_epsilon(0.5, 0.8, 3, 1e-5) + 1
