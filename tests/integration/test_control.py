"""The in-process Control API client against the ``flwr`` CLI, on a real SuperLink: the same
answers, or this Flower release changed what :mod:`deploy.control` relies on. (Its TLS side
runs in ``tests/integration/test_security.py``, which lists a secured SuperLink's nodes.)"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from deploy.bench.deployment import NOOP_APP
from deploy.flower import CONNECTION, FlowerDeployment, _cli_json, run_status
from deploy.local import ProcessGroup
from edge_client.runtime.node_config import NodeConfig


@pytest.mark.timeout(180)
def test_the_in_process_control_client_answers_what_the_flwr_cli_answers(
    tmp_path: Path, procs: ProcessGroup, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a SuperLink, one SuperNode, Flower's do-nothing app run to its end.
    flower = FlowerDeployment(procs, tmp_path / "flwr")
    flower.start_superlink()
    node = NodeConfig("dev-0", str(tmp_path / "b.sqlite"))
    flower.start_supernode("dev-0", node.to_node_config())
    flower.wait_nodes(1)
    timing = tmp_path / "noop.json"
    config = {"num-server-rounds": 1, "min-nodes": 1, "timing-file": str(timing)}
    run_id = flower.submit(NOOP_APP, config)
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while not (status := flower.status(run_id).get("status", "")).startswith("finished"):
        assert time.monotonic() < deadline, seen
        seen.add(status)
        time.sleep(0.2)

    # Execute: the same questions, in-process and through the CLI.
    with caplog.at_level(logging.INFO):
        ours = flower.status(run_id)
    cli = run_status(run_id, CONNECTION, flower.env)
    our_nodes = flower.list_nodes()
    cli_nodes = _cli_json("supernode", "list", CONNECTION, env=flower.env)["nodes"]
    unknown = str(int(run_id) + 1)

    # Assert: the same JSON (a node's seconds online go on counting between the two calls)
    assert status == "finished:completed" and timing.exists()
    assert ours == cli and ours["run-id"] == run_id
    assert "HTTP Request" not in caplog.text  # httpx's line per request: not in the console
    assert seen <= {"", "pending", "starting", "running"}
    moving = "online-elapsed"
    assert [{k: v for k, v in n.items() if k != moving} for n in our_nodes] == [
        {k: v for k, v in n.items() if k != moving} for n in cli_nodes
    ]
    assert [n["status"] for n in our_nodes] == ["online"]
    # a run the SuperLink does not know, and a SuperLink that is gone: nothing, as the CLI's
    assert flower.status(unknown) == {} == run_status(unknown, CONNECTION, flower.env)
    flower.kill_superlink()
    assert flower.status(run_id) == {} and flower.list_nodes() == []
