"""A device's agent is SIGKILLed while it trains a round and comes back, as systemd restarts
it: real broker, SuperLink, SuperNodes (process isolation) and agents (about 2 minutes)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from aggregator.round_log import read_metrics, rounds_only
from tests.helpers import DEMO_TEST_TIMEOUT_S, demo

TIMEOUT_S = 30  # the round timeout: a SuperNode left waiting for the dead task would hit it


@pytest.mark.timeout(DEMO_TEST_TIMEOUT_S)
def test_an_agent_killed_mid_task_costs_that_round_only_and_loses_no_sample(
    tmp_path: Path,
) -> None:
    # Prepare / Execute: dev-1 (4x slower) loses its agent while it trains round 2.
    rc, out, summary = demo(
        tmp_path,
        "--devices", "2", "--rounds", "3", "--local-steps", "20", "--slowdowns", "1,4",
        "--kill-agent", "dev-1@1", "--round-timeout", str(TIMEOUT_S),
    )  # fmt: skip

    # Assert: the run completes; round 2 counts dev-1 as failed ...
    assert rc == 0, out[-3000:]
    assert "killed dev-1's agent (SIGKILL) while it trained round 2" in out
    assert summary["status"] == "finished:completed" and summary["rounds"] == 3
    run_dir = next(tmp_path.glob("run-*"))
    records = rounds_only(read_metrics(run_dir / "metrics.jsonl"))
    assert records[1].failed == {"dev-1": 1} and "dev-1" not in records[1].devices
    # ... at once: the restarted agent answered the task its predecessor left, so neither
    # the round nor the SuperNode waited out the task's token (30-60 s) ...
    assert records[1].wall_s < TIMEOUT_S - 10, records[1].wall_s
    log = (run_dir / "logs" / "agent-dev-1.log").read_text()
    assert "answered as failed the task a stopped agent left mid-way" in log, log[-2000:]
    # ... and the next round trains dev-1 again, in its new agent.
    for record in records[2:]:
        assert record.devices["dev-1"].agent_cpu_s > 0
        assert record.failed == {"dev-1": 1}
    # No sample lost: those the killed round held aside went back into the buffer.
    assert "put back" in log
    with sqlite3.connect(run_dir / "buffers" / "dev-1.sqlite") as db:
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
    spent = counters.get("consumed", 0) + counters.get("dropped", 0)  # a counter starts at 1st use
    assert counters["accepted"] == counters["fill"] + spent
