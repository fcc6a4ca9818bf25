"""The hook through which the simulation engine's virtual devices reach the ClientApp."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

from deploy.inprocess import as_superlink
from edge_client.emulation.simulation import SimulationNodes
from edge_client.runtime import client_app, virtual_nodes
from edge_client.runtime.virtual_nodes import VirtualNodesError, provide_virtual_nodes


@pytest.fixture
def no_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process whose ClientApp was loaded without virtual devices (restored after)."""
    monkeypatch.setattr(virtual_nodes, "_factory", None)
    monkeypatch.setattr(virtual_nodes, "_nodes", None)
    yield


def _message() -> Message:
    as_superlink()  # as the SuperLink's side that makes messages
    return Message(RecordDict(), dst_node_id=1, message_type="train")


def _away(tmp_path: Path) -> Context:
    """Virtual device sim-0's context, the device away for the first minute."""
    trace = tmp_path / "fleet.csv"
    trace.write_text("device,slowdown,rate,offline\n0,,,0-60\n")
    config: dict[str, bool | float | int | str] = {"sim-population": f"trace={trace}"}
    return Context(1, 1, {"partition-id": 0, "num-partitions": 1}, RecordDict(), config)


def test_a_virtual_node_without_a_provider_says_which_app_to_load(
    no_provider: None, tmp_path: Path
) -> None:
    with pytest.raises(VirtualNodesError, match=r"edge_client\.flower_app:app"):
        client_app.absent_reply(_message(), _away(tmp_path))


def test_the_provider_runs_once_and_only_at_the_first_virtual_node(no_provider: None) -> None:
    # Prepare
    made: list[SimulationNodes] = []

    def factory() -> SimulationNodes:
        made.append(SimulationNodes())
        return made[-1]

    # Execute
    provide_virtual_nodes(factory)
    before = len(made)
    provide_virtual_nodes(factory)  # again, as each handler does
    first, second = virtual_nodes.virtual_nodes(), virtual_nodes.virtual_nodes()
    # Assert
    assert before == 0 and len(made) == 1 and first is second is made[0]


def test_the_app_flower_loads_brings_its_virtual_devices_to_a_bare_worker(
    no_provider: None, tmp_path: Path
) -> None:
    # Prepare: the app as the simulation engine ships it to a Ray worker, pickled; the
    # worker has imported nothing of fedstream.
    cloudpickle = pytest.importorskip("cloudpickle")
    from edge_client.flower_app import app

    shipped = tmp_path / "app.pkl"
    shipped.write_bytes(cloudpickle.dumps(app))
    (tmp_path / "context.pkl").write_bytes(cloudpickle.dumps((_message(), _away(tmp_path))))
    code = (
        "import pickle, sys; from pathlib import Path; d = Path(sys.argv[1]); "
        "app = pickle.loads((d / 'app.pkl').read_bytes()); "
        "msg, context = pickle.loads((d / 'context.pkl').read_bytes()); "
        "from flwr.supercore.task_identity import TaskIdentity; "
        "TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1; "
        "reply = app(msg, context); print(reply.error.code, reply.error.reason)"
    )
    # Execute
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    # Assert: the away device answers at once, from the emulation's population
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sim-0 is offline" in out.stdout
