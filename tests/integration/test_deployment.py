"""Federated training through Flower's deployment engine with real processes.

Broker, publishers, ingest daemons, a SuperLink and SuperNodes, started by
``fedstream demo`` exactly as a user runs it (these tests take about a minute each).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aggregator.records import read_metrics
from deploy.demo import APP_DIR
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup
from tests.helpers import demo


def test_short_run_finishes_and_the_slower_device_gets_the_smaller_batch(tmp_path: Path) -> None:
    # Execute: with the timing probe (the demo leaves it off by default).
    rc, out, summary = demo(
        tmp_path,
        *("--devices", "2", "--rounds", "2", "--local-steps", "40", "--slowdowns", "1,4"),
        *("--run-config", "controller-probe=3"),
    )
    # Assert: the probe's query went through the real SuperNodes, so the 4x slower device
    # already has the smaller batch in round 1.
    assert rc == 0, out[-3000:]
    assert summary["status"] == "finished:completed" and summary["rounds"] == 2
    batches = summary["devices"]
    assert batches["dev-1"]["batch_size"][0] < batches["dev-0"]["batch_size"][0]
    assert batches["dev-1"]["batch_size"][-1] < batches["dev-0"]["batch_size"][-1]
    # Chance is 1/6; 2 rounds of 40 steps reach about 0.6 (10 steps hovered near chance).
    assert summary["final_accuracy"] > 0.35
    run_dir = next(tmp_path.glob("run-*"))
    assert (run_dir / "report.png").stat().st_size > 10_000
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_flwr_run_in_the_simulation_engine_trains_on_replayed_streams(tmp_path: Path) -> None:
    # Prepare: a SuperLink in simulation mode with 3 virtual devices (Ray).
    with ProcessGroup() as group:
        flower = FlowerDeployment(group, tmp_path / "flwr", simulated_nodes=3)
        flower.start_superlink()
        # Execute
        run_id = flower.submit(
            APP_DIR,
            {
                "num-rounds": 2,
                "local-steps": 5,
                "out-dir": str(tmp_path / "out"),
                "sim-dir": str(tmp_path / "sim"),
                "sim-slowdowns": "1,1,4",
            },
        )
        status: dict[str, Any] = {}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = flower.status(run_id)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(2)
        logs = flower.logs(run_id)
    # Assert
    assert status.get("status") == "finished:completed", (status, logs[-3000:])
    records = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r.round for r in records] == [1, 2]
    assert set(records[-1].devices) == {"sim-0", "sim-1", "sim-2"}
    assert len(list((tmp_path / "sim").glob("run-*/sim-*.sqlite"))) == 3
