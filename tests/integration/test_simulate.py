"""``fedstream simulate`` as a user runs it: Flower's simulation engine (a real SuperLink in
simulation mode, Ray), virtual devices each streaming one person's windows of a recording in
recorded order, held-out people scored apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.round_log import read_metrics, rounds_only
from deploy.local import fedstream_command
from edge_client.emulation.people import PEOPLE_KEY, people_recording
from tests.helpers import run_command

SIMULATE_TIMEOUT_S = 300


def _simulate(out: Path, *args: str) -> tuple[int, str, dict[str, Any], Path | None]:
    proc = run_command(
        fedstream_command("simulate", "--no-live", "--out", str(out), *args),
        timeout=SIMULATE_TIMEOUT_S,
    )
    runs = sorted(out.glob("sim-*"))
    summary = json.loads((runs[-1] / "summary.json").read_text()) if runs else {}
    return (
        proc.returncode,
        " ".join((proc.stdout + proc.stderr).split()),
        summary,
        (runs[-1] if runs else None),
    )


@pytest.mark.timeout(2 * SIMULATE_TIMEOUT_S + 60)
def test_one_device_per_person_scores_each_device_and_each_held_out_person_and_repeats(
    tmp_path: Path,
) -> None:
    # Prepare: 6 people, the first 4 streaming, the last 2 held out; data injection on (half
    # the devices share each round from round 2, through the simulation's shared topic)
    people = people_recording(6, seed=2)
    train = people.where([1, 2, 3, 4]).save(tmp_path / "train.npz")
    test = people.where([5, 6]).save(tmp_path / "test.npz")
    args = ["--source", str(train), "--partition-by", PEOPLE_KEY, "--test", str(test)]
    args += ["--rounds", "3", "--seed", "7", "--run-config", "inject-alpha=0.5"]
    # Execute: the same seeded run twice
    rc, out, summary, run_dir = _simulate(tmp_path / "one", *args)
    rc2, _out2, summary2, run_dir2 = _simulate(tmp_path / "two", *args)
    # Assert: one device per person, every one replying in every round with its score
    assert rc == 0 and rc2 == 0, out[-3000:]
    assert run_dir is not None and run_dir2 is not None
    assert summary["devices_simulated"] == 4 and summary["status"] == "finished:completed"
    records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
    assert len(records) == 3
    for record in records:
        assert sorted(record.devices) == [f"{PEOPLE_KEY}-{i}" for i in (1, 2, 3, 4)]
        assert all(m.num_examples > 0 and m.eval_count > 0 for m in record.devices.values())
    # the fleet's scores in the task's metric, and each held-out person's
    assert summary["metric"] == "accuracy"
    for key in ("device_score_mean", "device_score_median", "device_score_worst10"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["device_score_worst10"] <= summary["device_score_median"]
    assert sorted(summary["test_by_group"]) == ["5", "6"]
    assert set(summary["source_passes"]) == set(records[-1].devices)
    assert (run_dir / "report.png").stat().st_size > 0
    assert "worst 10 %" in out and "held-out accuracy per group" in out
    # Assert: two devices shared in round 2 (the aggregator learns who opted in from round
    # 1's replies), and every device mixed what they shared into its batches of round 3
    assert [sum(m.inject_bytes > 0 for m in r.devices.values()) for r in records] == [0, 2, 2]
    assert all(m.inject_used == 0 for r in records[:2] for m in r.devices.values())
    assert all(m.inject_used > 0 for m in records[2].devices.values())
    # Assert: the seeded run repeated: the same scores, device by device, round by round
    again = rounds_only(read_metrics(run_dir2 / "metrics.jsonl"))
    assert [
        {d: (m.eval_metric, m.num_examples, m.inject_used) for d, m in r.devices.items()}
        for r in records
    ] == [
        {d: (m.eval_metric, m.num_examples, m.inject_used) for d, m in r.devices.items()}
        for r in again
    ]
    assert summary2["test_by_group"] == summary["test_by_group"]


@pytest.mark.parametrize(
    ("key", "said"),
    [("user", "no array 'user'"), ("one", "one group")],
)
def test_a_partition_key_that_is_missing_or_has_one_group_is_refused_in_one_line(
    tmp_path: Path, key: str, said: str
) -> None:
    # Prepare: a recording with arrays x, y, subject and one, the last a single group
    people = people_recording(2, seed=0)
    path = tmp_path / "rec.npz"
    np.savez(path, x=people.x, y=people.y, subject=people.subject, one=np.zeros_like(people.y))
    # Execute
    rc, out, _summary, run_dir = _simulate(tmp_path, "--source", str(path), "--partition-by", key)
    # Assert: refused before anything started, in one line naming what the file has
    assert rc != 0 and run_dir is None
    assert said in out and "subject" in out, out


@pytest.mark.timeout(SIMULATE_TIMEOUT_S + 60)
def test_a_private_secure_simulation_samples_unmasks_and_spends_what_the_accountant_says(
    tmp_path: Path,
) -> None:
    # Prepare: 10 virtual devices, three quarters drawn a round (a secret draw under DP: a
    # round of 2 or fewer, too few to mask, comes once in about 2,400), central DP, a budget
    # of 3 rounds, under secure aggregation (dropouts: the unit tests and fedstream bench
    # secagg)
    budget = (library_epsilon(3) + library_epsilon(4)) / 2
    config = (
        f"dp='central' dp-noise=0.8 dp-clip=1.0 fraction-train={FRACTION} global-batch=256 "
        f"dp-epsilon={budget} controller-probe=0 secure-aggregation=true "
        "secagg-min-survivors=2"
    )
    # Execute: asked for 6 rounds
    rc, out, summary, run_dir = _simulate(
        tmp_path, "--devices", "10", "--rounds", "6", "--seed", "3", "--run-config", config
    )
    # Assert: the budget ended it after round 3, each round's epsilon the library's, only
    # the drawn devices trained, and the records name no device (only the round's counts)
    assert rc == 0, out[-3000:]
    assert run_dir is not None
    records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
    assert [r.round for r in records] == [1, 2, 3]
    assert [r.dp_epsilon_spent for r in records] == pytest.approx(
        [library_epsilon(n) for n in (1, 2, 3)]
    )
    assert summary["dp_epsilon_spent"] == pytest.approx(library_epsilon(3))
    assert "sim-" not in (run_dir / "metrics.jsonl").read_text()
    assert not summary["devices"] and not summary["device_scores"]
    for record in records:
        assert record.devices_hidden and not record.devices
        assert record.live == 10 and record.replied_count == record.planned_count
        # every device that trained is in the unmasked sum
        assert record.secagg_survivors == record.aggregated_count == record.replied_count >= 2
        assert record.secagg_dropped == 0 and not record.skipped
    assert "epsilon" in out


#: The private simulation's sampling rate.
FRACTION = 0.75


def library_epsilon(rounds: int) -> float:
    """Google's RDP accountant for q = FRACTION, noise 0.8, delta 1e-5, computed apart."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    event = dp_event.PoissonSampledDpEvent(FRACTION, dp_event.GaussianDpEvent(0.8))
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(1e-5))
