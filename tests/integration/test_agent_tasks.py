"""The device agent taking its SuperNode's tasks itself: a real SuperLink, a real SuperNode
in process isolation (``fedstream-supernode``), real agents.

(The demo's runs through it: tests/integration/test_deployment.py, tests/faults.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from aggregator.round_log import read_metrics, rounds_only
from deploy.agents import agent_sockets, task_secret
from deploy.demo import APP_DIR
from deploy.flower import FlowerDeployment
from deploy.local import ProcessGroup, fedstream_command, wait_for_port, wait_until
from edge_client.flower_internals import TaskClient
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.model_store import store_model
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.task_taker import read_secret
from edge_client.task import Classification, init_model
from edge_client.task.synthetic import SensorTask
from edge_client.wire.frames import SampleBatch
from edge_client.wire.run_config import RunSettings
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


@pytest.mark.timeout(240)
def test_infer_takes_its_supernodes_tasks_in_its_own_torch_process(
    tmp_path: Path, procs: ProcessGroup, broker: Any
) -> None:
    # Prepare: a model for inference, a filled buffer, a SuperNode leaving its tasks to the
    # process with its secret, and `fedstream infer` holding that secret (one torch process).
    settings = RunSettings(
        num_rounds=1, min_nodes=1, global_batch=32, local_steps=2, model_width=8,
        eval_data="synthetic", out_dir=str(tmp_path / "run"),
        checkpoint_dir=str(tmp_path / "run" / "checkpoint"),
    )  # fmt: skip
    task = Classification(width=8)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    store_model(tmp_path / "models", task, settings, weights, 1, "dev-0", None)
    buffer = tmp_path / "dev-0.sqlite"
    x, y = SensorTask().sample(500, np.random.default_rng(0))
    with BufferStore(buffer, shape=settings.shape) as store:
        store.append([SampleBatch(x, y, time.time() + np.arange(500.0) * 1e-3)])
    with agent_sockets() as private:
        assert private is not None
        secret = task_secret(private, "dev-0")
        flower = FlowerDeployment(procs, tmp_path / "flwr")
        flower.start_superlink()
        node = NodeConfig("dev-0", str(buffer), threads=1)
        flower.start_supernode("dev-0", node.to_node_config(), tasks_secret=secret)
        flower.wait_nodes(1)
        log = tmp_path / "infer.log"
        procs.start(
            "infer",
            fedstream_command(
                "infer", "--broker", broker.url, "--device-id", "dev-0",
                "--model", str(tmp_path / "models"), "--drift", "none",
                "--runtime-api", f"127.0.0.1:{flower.runtime_ports['dev-0']}",
                "--superexec-auth-secret-file", str(secret),
            ),
            log_path=log,
        )  # fmt: skip
        # Execute: a round of fedstream's app
        flower.submit(APP_DIR, settings.to_run_config())
        metrics = tmp_path / "run" / "metrics.jsonl"
        done = wait_until(lambda: len(rounds_only(read_metrics(metrics))) >= 1, 180)
        # Assert: trained in the inference daemon's process, no ClientApp process
        assert done, log.read_text()[-3000:]
        (record,) = rounds_only(read_metrics(metrics))
        reply = record.devices["dev-0"]
        assert reply.agent_cpu_s > 0 and reply.cpu_s == 0, reply
        # ... which its SuperNode woke when the task was ready (no polling for it)
        assert "its SuperNode wakes it when a task is ready" in log.read_text()
