"""The device agent taking its SuperNode's tasks itself: a real SuperLink, a real SuperNode
in process isolation (``fedstream-supernode``), real agents.

(The demo's runs through it: tests/integration/test_deployment.py, tests/faults.)
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from deploy.agents import agent_sockets, task_secret
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup, fedstream_command, wait_for_port
from edge_client.runtime.flower_internals import TaskClient
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.task_taker import read_secret
from tests.helpers import run_command


@pytest.mark.timeout(180)
def test_only_a_process_holding_the_superexec_secret_may_take_a_devices_tasks(
    tmp_path: Path, procs: ProcessGroup
) -> None:
    # Prepare: a SuperNode whose tasks are left for its agent, signed with its secret.
    with agent_sockets() as private:
        assert private is not None
        secret = task_secret(private, "dev-0")
        flower = FlowerDeployment(procs, tmp_path / "flwr")
        flower.start_superlink()
        node = NodeConfig("dev-0", str(tmp_path / "dev-0.sqlite"))
        flower.start_supernode("dev-0", node.to_node_config(), tasks_secret=secret)
        flower.wait_nodes(1)
        port = flower.runtime_ports["dev-0"]
        assert wait_for_port(port, timeout=30)
        address = f"127.0.0.1:{port}"

        # Execute / Assert: the secret is private to its user ...
        assert os.stat(secret).st_mode & 0o777 == 0o600
        # ... another local process, with a guessed secret, is refused ...
        with pytest.raises(httpx.HTTPStatusError, match="401"):
            TaskClient(address, b"a guess").acquire()
        # ... the agent's is let in (no task waits yet) ...
        assert TaskClient(address, read_secret(secret)).acquire() is None
        # ... and an agent started with the wrong file says so and exits 1.
        wrong = private / "other.secret"
        wrong.write_text("not it")
        wrong.chmod(0o600)
        proc = run_command(
            fedstream_command(
                "agent", "--runtime-api", address, "--superexec-auth-secret-file", str(wrong)
            ),
            timeout=120,
        )
        assert proc.returncode == 1
        assert "refused this agent's SuperExec secret (HTTP 401)" in proc.stdout + proc.stderr
