"""Device populations of the simulation engine: distributions, presets, trace files, churn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.common.constant import ErrorCode

from deploy.inprocess import as_superlink
from edge_client.emulation.population import DeviceProfile, profile_of
from edge_client.flower_app import absent_reply
from edge_client.wire.constants import RATE_SETS
from edge_client.wire.population import parse_population


def test_a_trace_file_drives_slowdowns_rates_and_absences(tmp_path: Path) -> None:
    # Prepare: two devices listed (one partly), two left to the defaults
    trace = tmp_path / "fleet.csv"
    trace.write_text("device,slowdown,rate,offline\n0,2.5,100,10-20;30-40\nsim-2,,50,\n")
    population = parse_population(f"trace={trace}")
    # Execute
    fleet = [profile_of(population, i, 0, slowdowns=(1.0, 3.0), rates=(400.0,)) for i in range(4)]
    # Assert
    assert (fleet[0].slowdown, fleet[0].rate) == (2.5, 100.0)
    assert [fleet[0].online(t) for t in (5, 10, 15, 20, 35, 45)] == [
        True, False, False, True, False, True,
    ]  # fmt: skip
    assert (fleet[1].slowdown, fleet[1].rate, fleet[1].offline) == (3.0, 400.0, ())
    assert (fleet[2].slowdown, fleet[2].rate) == (1.0, 50.0)  # its slowdown: the default's
    assert all(fleet[3].online(t) for t in range(0, 100, 7))


def test_presets_follow_omnilearn_and_scadles_and_draws_repeat_per_seed() -> None:
    # Prepare
    population = parse_population("slowdown=omnilearn(HL4) rate=scadles(S2)")
    # Execute
    first = [profile_of(population, i, seed=7) for i in range(400)]
    again = [profile_of(population, i, seed=7) for i in range(400)]
    other = [profile_of(population, i, seed=8) for i in range(400)]
    # Assert: HL4's cores 9/9/6/24 cycled (slowdown = 24 / cores); S2 is uniform with mean
    # 300 and sd 112, so within 300 +- 112 * sqrt(3); the same seed, the same fleet.
    assert [p.slowdown for p in first[:5]] == [24 / 9, 24 / 9, 4.0, 1.0, 24 / 9]
    rates = np.array([p.rate for p in first])
    _, mean, sd = RATE_SETS["S2"]
    assert rates.min() >= mean - sd * 3**0.5 and rates.max() <= mean + sd * 3**0.5
    assert abs(rates.mean() - mean) < 3 * sd / len(rates) ** 0.5 + 1
    assert first == again and [p.rate for p in first] != [p.rate for p in other]


def test_churn_keeps_devices_online_for_its_share_of_the_time() -> None:
    # Prepare: online spells of 90 s on average, offline of 10 s: 90 % of the time online
    population = parse_population("availability=churn(90,10)")
    fleet = [profile_of(population, i, seed=1) for i in range(200)]
    # Execute: each device looked at every 50 s for an hour
    seen = np.array([[p.online(t) for t in range(0, 3600, 50)] for p in fleet])
    # Assert: the share online is the stationary 0.9; devices differ
    assert abs(seen.mean() - 0.9) < 0.03
    assert len({tuple(row) for row in seen}) > 100


def test_distributions_are_floored_at_what_a_device_can_be() -> None:
    population = parse_population("slowdown=uniform(0.2,0.5) rate=normal(0.5,0.1)")
    assert profile_of(population, 0, 0) == DeviceProfile(1.0, 1.0, churn_seed=(0, "sim-0"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("speed=const(2)", "expected slowdown=, rate="),
        ("slowdown=gamma(1,2)", "expected one of const"),
        ("slowdown=uniform(1)", "uniform takes 2 numbers"),
        ("slowdown=uniform(4,1)", "needs A <= B"),
        ("rate=const(fast)", "is not a number"),
        ("slowdown=omnilearn(HL3)", "one of HL1, HL2, HL4, HL8"),
        ("rate=scadles(S9)", "one of S1, S2"),
        ("availability=churn(10,-1)", "must be > 0"),
        ("trace=fleet.json", "a .csv file is expected"),
    ],
)
def test_bad_populations_are_refused_with_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_population(spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("device,rate\n0,5\n", "the header needs"),
        ("device,slowdown,rate,offline\npi,1,1,\n", "not a partition id"),
        ("device,slowdown,rate,offline\n0,1,1,20-10\n", "0 <= START < END"),
        ("device,slowdown,rate,offline\n0,-2,1,\n", "must be > 0"),
    ],
)
def test_bad_trace_files_are_refused_with_the_line(tmp_path: Path, text: str, message: str) -> None:
    trace = tmp_path / "fleet.csv"
    trace.write_text(text)
    with pytest.raises(ValueError, match=message):
        profile_of(parse_population(f"trace={trace}"), 0, 0)
    with pytest.raises(ValueError, match="cannot read the population trace"):
        profile_of(parse_population(f"trace={tmp_path / 'missing.csv'}"), 0, 0)


def test_an_away_virtual_device_answers_node_unavailable_at_once(tmp_path: Path) -> None:
    # Prepare: sim-0 away for its first minute, sim-1 always there
    trace = tmp_path / "fleet.csv"
    trace.write_text("device,slowdown,rate,offline\n0,,,0-60\n")
    config: dict[str, bool | float | int | str] = {"sim-population": f"trace={trace}"}

    def context(pid: int) -> Context:
        return Context(1, pid + 1, {"partition-id": pid, "num-partitions": 2}, RecordDict(), config)

    as_superlink()  # as the SuperLink's side that makes messages
    msg = Message(RecordDict(), dst_node_id=1, message_type="train")
    # Execute
    away, there = absent_reply(msg, context(0)), absent_reply(msg, context(1))
    # Assert
    assert there is None
    assert away is not None and away.has_error()
    assert away.error.code == ErrorCode.NODE_UNAVAILABLE
    assert "sim-0 is offline" in str(away.error.reason)
