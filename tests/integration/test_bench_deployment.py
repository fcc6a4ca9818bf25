"""``fedstream bench deployment --quick`` as a user runs it: real SuperLinks, SuperNodes,
broker and ingest daemons on this machine. Its figures are not asserted (this machine is
shared); that it runs, and that its breakdowns add up, are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.bench.deployment import QUICK_SOAK_EVERY, QUICK_SOAK_MESSAGES
from deploy.breakdown import PARTS
from deploy.local import fedstream_command
from tests.helpers import run_command

#: Stated tolerances of the breakdown on a real deployment: the round's wall time that no
#: part measured, and Flower's share read as a remainder (it must not be negative).
UNMEASURED_SHARE = 0.02
HANDLER_UNMEASURED_SHARE = 0.01


@pytest.mark.timeout(900)
def test_the_quick_deployment_benchmark_runs_and_its_breakdowns_add_up(tmp_path: Path) -> None:
    # Execute
    proc = run_command(
        fedstream_command(
            "bench", "deployment", "--quick", "--out", str(tmp_path), "--json",
            str(tmp_path / "copy.json"),
        ),
        timeout=840,
    )  # fmt: skip
    # Assert: every variant ran, side by side, against the tuned plain Flower app
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "deployment.json").read_text())
    assert doc == json.loads((tmp_path / "copy.json").read_text())
    by = {e["variant"]: e for e in doc["entries"]}
    assert set(by) == {
        "flower-do-nothing",
        "plain-flower-tuned",
        "plain-flower-tuned-pull",
        "fedstream-idle",
        "fedstream-idle-agent",
        "fedstream-live",
        "fedstream-live-agent",
        "controller-fixed",
        "controller-dynamic",
    }
    assert by["plain-flower-tuned"]["vs_plain_tuned"] == 1.0
    assert by["plain-flower-tuned-pull"]["vs_plain_tuned_pull"] == 1.0
    assert doc["repetitions"] == 1 and doc["ratios"]["fedstream-idle"]["plain-flower-tuned"]
    # agents take their SuperNodes' tasks in the -agent arms and the controller pair: no
    # ClientApp process there, a ClientApp process per message elsewhere
    taking = (
        "fedstream-idle-agent",
        "fedstream-live-agent",
        "controller-fixed",
        "controller-dynamic",
    )
    for name, e in by.items():
        assert e["rounds"] == 2 and all(w > 0 for w in e["round_wall_s"])
        assert (e["clientapp_cpu_s_per_round"] == 0) == (name in taking), (name, e)
    # fedstream's rounds: the parts add up to the wall time, within the stated tolerance
    fedstream = ("fedstream-idle", "fedstream-live", "controller-fixed", "controller-dynamic")
    for name in (*fedstream, "fedstream-idle-agent", "fedstream-live-agent"):
        shares = by[name]["breakdown"]["shares"]
        assert list(shares) == list(PARTS)
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
        assert abs(shares["other"]) <= UNMEASURED_SHARE, shares
        assert abs(shares["handler-other"]) <= HANDLER_UNMEASURED_SHARE, shares
        assert shares["flower"] >= -UNMEASURED_SHARE and shares["start"] > 0, shares
    # the device's footprint and the controller pair's time to an accuracy both reach
    footprint = by["fedstream-live"]["footprint"]
    assert footprint["accepted_samples"] > 0 and footprint["written_per_accepted_sample"] > 0
    assert footprint["pss_peak_bytes"] > 0
    assert set(footprint["peak_rss_bytes"]) == {
        "ingest", "supernode", "superexec", "agent", "clientapp"
    }  # fmt: skip
    # with agents: no ClientApp process at all; one agent per device holds torch
    with_agent = by["fedstream-live-agent"]["footprint"]
    assert with_agent["processes_seen"].get("clientapp", 0) == 0
    assert with_agent["processes_seen"]["agent"] == 2 == with_agent["torch_processes"]["agent"]
    assert footprint["torch_processes"]["clientapp"] > 0  # without: each message loads it
    assert by["fedstream-live-agent"]["agent_cpu_s_per_message"] > 0
    assert doc["agent"]["per_repetition"][0]["do_nothing_clientapp_cpu_s"] > 0
    # the soak went through a real SuperNode to an agent taking its tasks
    soak = doc["soak"]
    assert soak["messages"] == QUICK_SOAK_MESSAGES and soak["round_s_median"] > 0
    read_at = [n for n, _ in soak["rss_bytes"]]  # after the first, then every QUICK_SOAK_EVERY
    assert read_at[0] < QUICK_SOAK_EVERY <= read_at[1] and read_at[-1] == QUICK_SOAK_MESSAGES
    # every goal judged from this run's own figures, in its one repetition and seed
    assert by["fedstream-idle-agent"]["device_cpu_s_per_round"] > 0
    assert by["fedstream-idle-agent"]["slowest_compute_s"] > 0
    assert set(doc["goals"]) == {
        "idle-round-vs-plain", "idle-round-above-compute-s", "device-cpu-s-per-idle-round",
        "controller-time-to-0.9", "controller-fixed-slowest-training-share", "soak-rss-growth",
    }  # fmt: skip
    for name, goal in doc["goals"].items():
        assert len(goal["values"]) == 1 and goal["verdict"] in ("met", "MISSED"), name
    assert doc["goals"]["idle-round-vs-plain"]["values"] == [
        by["fedstream-idle-agent"]["vs_plain_tuned"]
    ]
    for name in ("controller-fixed", "controller-dynamic"):
        common = str(by[name]["common_target"])
        assert by[name]["time_to_s"][common] is not None
        assert len(by[name]["curve"]) == 2
    assert "plain-flower-tuned" in proc.stdout  # the table
