"""A device's SuperNode is killed mid-run and comes back: real processes (1-2 minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.round_log import read_metrics, rounds_only
from tests.helpers import DEMO_TEST_TIMEOUT_S, demo


@pytest.mark.timeout(DEMO_TEST_TIMEOUT_S)
def test_a_killed_supernode_rejoins_and_keeps_its_state_by_device_id(tmp_path: Path) -> None:
    # Prepare / Execute: dev-2 (slowdown 2) dies after round 1 and restarts at once, on a new
    # Flower node id; its old node's message of round 2 (or 3, on a busy machine where the
    # kill lands late) is lost.
    rc, out, summary = demo(
        tmp_path,
        "--devices", "3", "--rounds", "5", "--local-steps", "5", "--slowdowns", "1,1,2",
        "--kill", "dev-2@1", "--restart", "dev-2@1", "--round-timeout", "15",
    )  # fmt: skip

    # Assert: the run completes, dev-2 is back under its device id, and the failed message
    # (the dead node's) is counted against dev-2, not against an anonymous node.
    assert rc == 0, out[-3000:]
    assert summary["status"] == "finished:completed" and summary["rounds"] == 5
    run_dir = next(tmp_path.glob("run-*"))
    records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
    assert "dev-2" in records[-1].devices and "dev-2" in records[0].devices
    assert records[-1].failed.get("dev-2", 0) >= 1
    assert not [d for r in records for d in (*r.devices, *r.failed) if d.startswith("node-")]
    assert "restarted dev-2's SuperNode after round 1" in out
    # Its controller state survived under its device id: the throughput first measured in
    # round 1, before the kill, is still the one the checkpoint holds; the dead node is
    # retired and the new one maps to dev-2.
    state = json.loads((run_dir / "checkpoint" / "state.json").read_text())
    first = state["controller"]["devices"]["dev-2"]["first_throughput"]
    # its first timing of round 1, the scoring of its samples included (what it observes)
    batch, step_s = records[0].devices["dev-2"].costs()[0]
    assert abs(first - batch / step_s) < 1e-6 * first
    assert set(state["controller"]["devices"]) == {"dev-0", "dev-1", "dev-2"}
    assert len(state["retired-nodes"]) == 1 and "dev-2" in state["node-devices"].values()
    # Once dev-2 replied from its new node, its old one was sent nothing more: no round
    # after that adds a failure (a round timeout each, were it still planned).
    lost = next(i for i, r in enumerate(records) if r.failed.get("dev-2"))
    back = next(i for i in range(lost + 1, len(records)) if "dev-2" in records[i].devices)
    assert back < len(records) - 1, "dev-2 came back too late to check its old node's retirement"
    assert all(r.failed == records[back].failed for r in records[back + 1 :])
    # Its agent lost the SuperNode it took tasks from, waited, and took them again from the
    # restarted one (same runtime API port): the last rounds trained in the agent.
    agent_log = (run_dir / "logs" / "agent-dev-2.log").read_text()
    assert "not reachable" in agent_log and "is back" in agent_log, agent_log[-2000:]
    assert records[-1].devices["dev-2"].agent_cpu_s > 0
