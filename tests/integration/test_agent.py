"""The device agent: real ``fedstream agent`` processes, the ClientApp as their adapter.

(On real SuperNodes the demo runs through agents by default: tests/integration/test_cli.py.)
"""

from __future__ import annotations

import json
import signal
import socket as sk
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.common.serde import message_to_proto

from aggregator.round_log import rounds_only
from aggregator.server_app import run_rounds
from deploy.agents import agent_sockets, start_agents
from deploy.inprocess import InProcessGrid, VirtualDevice, as_superlink
from deploy.local import ProcessGroup, fedstream_command, wait_until
from deploy.probes import MqttProbe
from edge_client.runtime.agent import DeviceAgent
from edge_client.runtime.agent_channel import (
    AgentReply,
    AgentRequest,
    read_frame,
    send_request,
    write_frame,
)
from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.client_app import make_client_app
from edge_client.runtime.model_store import store_model
from edge_client.runtime.node_config import NodeConfig
from edge_client.task.interface import Classification, init_model
from edge_client.task.models import build_model
from edge_client.wire.frames import SampleBatch, encode_frame
from edge_client.wire.records import ARRAYS, CONFIG, DeviceReply, RoundPlan
from edge_client.wire.run_config import RunSettings
from edge_client.wire.topics import predictions_topic, samples_topic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "activity-app"
SHAPE = (16,)


def step_time(b: int) -> float:
    """A virtual step cost: plans do not depend on this machine's load."""
    return 0.001 + 1e-5 * b


@pytest.fixture
def agents(tmp_path: Path, procs: ProcessGroup) -> Iterator[Callable[[int], dict[str, Path]]]:
    """Start ``n`` real agents (dev-0, dev-1, ...); each is stopped by pid at the end."""
    with agent_sockets() as sockets:
        assert sockets is not None

        def start(n: int) -> dict[str, Path]:
            buffers = {f"dev-{i}": tmp_path / "buffers" / f"dev-{i}.sqlite" for i in range(n)}
            return start_agents(procs, buffers, sockets, logs=tmp_path / "logs")

        yield start


def _devices(n: int, sockets: dict[str, Path] | None = None) -> list[VirtualDevice]:
    return [
        VirtualDevice(f"dev-{i}", rate=20_000, agent=str((sockets or {}).get(f"dev-{i}", "")))
        for i in range(n)
    ]


def test_rounds_through_agents_reply_as_rounds_in_the_clientapps_own_process(
    tmp_path: Path, fast: Callable[..., RunSettings], agents: Callable[[int], dict[str, Path]]
) -> None:
    # Prepare: the same seeded run, in process and through two real agents.
    settings = fast(num_rounds=3, local_steps=5)
    sockets = agents(2)
    own = InProcessGrid(_devices(2), tmp_path / "own", step_time=step_time)
    via = InProcessGrid(_devices(2, sockets), tmp_path / "via", step_time=step_time)
    # Execute
    alone = rounds_only(run_rounds(own, settings))
    handed = rounds_only(run_rounds(via, settings))
    # Assert: the same rounds (same wire format, same replies), and the agent did the work.
    assert [r.accuracy for r in handed] == pytest.approx([r.accuracy for r in alone], abs=1e-6)
    assert [r.planned for r in handed] == [r.planned for r in alone]
    assert not any(r.failed for r in handed)
    entry = handed[-1].devices["dev-0"]
    assert entry.agent_cpu_s > 0 and entry.agent_peak_rss > 0
    assert alone[-1].devices["dev-0"].agent_cpu_s == 0


def _train_message(path: Path, server_round: int = 1) -> Message:
    """A train message for a device with buffer ``path``, as the aggregator sends it."""
    as_superlink(7)
    model = build_model("mlp", SHAPE, 6, width=16)
    content = RecordDict(
        {
            ARRAYS: ArrayRecord(model.state_dict()),
            CONFIG: RoundPlan(16, 5, 0.05, server_round=server_round).to_record(),
        }
    )
    return Message(content, dst_node_id=1, message_type="train", ttl=120.0)


def _context(buffer: Path, agent: Path, slowdown: float = 1.0) -> Context:
    node = NodeConfig("dev-0", str(buffer), slowdown=slowdown, agent=str(agent))
    run_config = RunSettings(sample_shape="16", model="mlp", model_width=16).to_run_config()
    return Context(7, 1, node.to_node_config(), RecordDict(), run_config)


def _fill(buffer: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    with BufferStore(buffer, shape=SHAPE) as store:
        x = rng.normal(size=(n, *SHAPE)).astype(np.float32)
        store.append([SampleBatch(x=x, y=rng.integers(0, 6, n), ts=np.arange(n, dtype=float))])


def test_the_clientapp_process_imports_no_torch_and_returns_the_agents_reply(
    tmp_path: Path, agents: Callable[[int], dict[str, Path]]
) -> None:
    # Prepare: a buffer, an agent, and a message and context as a flwr-clientapp gets them.
    buffer = tmp_path / "buffers" / "dev-0.sqlite"
    buffer.parent.mkdir(parents=True)
    _fill(buffer, 400)
    socket = agents(1)["dev-0"]
    context = _context(buffer, socket)
    frame = tmp_path / "message.bin"
    frame.write_bytes(message_to_proto(_train_message(buffer)).SerializeToString())
    script = f"""
import json, sys
from flwr.app import Context, RecordDict
from flwr.common.serde import message_from_proto
from flwr.proto.message_pb2 import Message
from edge_client.flower_app import app
msg = message_from_proto(Message.FromString(open({str(frame)!r}, "rb").read()))
context = Context(7, 1, {context.node_config!r}, RecordDict(), {context.run_config!r})
reply = app(msg, context)
metrics = reply.content.metric_records["metrics"]
print(json.dumps({{"torch": "torch" in sys.modules, "error": reply.has_error(),
                  "examples": metrics["num-examples"], "agent-cpu-s": metrics["agent-cpu-s"]}}))
"""
    # Execute: Flower's ClientApp, as Flower loads it, in a process of its own.
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    # Assert
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "torch": False,
        "error": False,
        "examples": 80,
        "agent-cpu-s": seen["agent-cpu-s"],
    }
    assert seen["agent-cpu-s"] > 0


def test_an_agent_killed_mid_round_costs_that_round_only_and_loses_no_sample(
    tmp_path: Path, procs: ProcessGroup, agents: Callable[[int], dict[str, Path]]
) -> None:
    # Prepare: a slow device (each step stretched 400x), its agent and 400 samples.
    buffer = tmp_path / "buffers" / "dev-0.sqlite"
    buffer.parent.mkdir(parents=True)
    _fill(buffer, 400)
    socket = agents(1)["dev-0"]
    app = make_client_app()
    context = _context(buffer, socket, slowdown=400.0)
    held = BufferStore(buffer)
    # Execute 1: kill -9 the agent once the round has taken its samples.
    killer = procs.procs["agent-dev-0"]
    result: list[Message] = []
    thread = threading.Thread(target=lambda: result.append(app(_train_message(buffer), context)))
    thread.start()
    assert wait_until(lambda: held.stats()["fill"] < 400, 60)
    killer.send_signal(signal.SIGKILL)
    thread.join(timeout=60)
    # Assert 1: an error reply that names the agent; the samples are held, not lost.
    (reply,) = result
    assert reply.has_error() and str(socket) in str(reply.error.reason)
    assert held.stats()["fill"] == 320 and held.stats()["consumed"] == 80
    # Execute 2: the agent is back (systemd restarts it), the next round runs.
    procs.procs.pop("agent-dev-0")
    start_agents(procs, {"dev-0": buffer}, socket.parent, logs=tmp_path / "logs2")
    after = app(_train_message(buffer, 2), _context(buffer, socket))
    # Assert 2: the held samples went back first; every sample counted once.
    restarted = procs.procs["agent-dev-0"]
    assert not after.has_error(), (
        f"{after.error.reason}; restarted agent exit code {restarted.poll()}, its log: "
        + (tmp_path / "logs2" / "agent-dev-0.log").read_text(errors="replace")[-3000:]
    )
    stats = held.stats()
    assert DeviceReply.from_content(after.content).metrics.num_examples == 80
    assert stats["fill"] == 320 and stats["consumed"] == 80 and stats["accepted"] == 400
    held.close()


def test_starting_an_agent_where_another_listener_holds_its_socket_fails_saying_so(
    tmp_path: Path, procs: ProcessGroup
) -> None:
    # Prepare: something already listening on the device's socket (an agent that outlived
    # its kill, a second copy), bound before the new agent starts.
    buffer = tmp_path / "buffers" / "dev-0.sqlite"
    with agent_sockets() as sockets, sk.socket(sk.AF_UNIX, sk.SOCK_STREAM) as held:
        assert sockets is not None
        held.bind(str(sockets / "dev-0.sock"))
        held.listen(8)
        # Execute / Assert: the old listener answering is not taken for the new agent, which
        # refuses to take its socket over and exits; the error says why.
        with pytest.raises(RuntimeError, match="already listens"):
            start_agents(procs, {"dev-0": buffer}, sockets, logs=tmp_path / "logs")


def test_a_missing_agent_a_stale_version_and_a_garbled_frame_get_clear_errors(
    tmp_path: Path,
) -> None:
    # Prepare: an agent in this process (the channel is what is tested).
    buffer = tmp_path / "dev-0.sqlite"
    _fill(buffer, 100)
    with agent_sockets() as sockets:
        assert sockets is not None
        agent = DeviceAgent(sockets / "a.sock")
        agent.start()
        try:
            msg = _train_message(buffer)
            context = _context(buffer, sockets / "a.sock")
            old = AgentRequest(
                "train", msg, 7, context.node_config, context.run_config, version="0.0.1"
            )
            # Execute
            stale = send_request(sockets / "a.sock", old, timeout=30)
            missing = make_client_app()(msg, _context(buffer, sockets / "none.sock"))
            with sk.socket(sk.AF_UNIX, sk.SOCK_STREAM) as raw:
                raw.connect(str(sockets / "a.sock"))
                write_frame(raw, b"\x00\x00\x00\x05{nope")
                garbled = AgentReply.from_bytes(read_frame(raw))
            fine = make_client_app()(msg, context)
        finally:
            agent.stop()
    # Assert: each says what is wrong; the agent goes on serving.
    assert stale.error is not None and "fedstream 0.0.1" in stale.error
    assert missing.has_error() and "no agent at" in str(missing.error.reason)
    assert "fedstream agent --socket" in str(missing.error.reason)
    assert garbled.error is not None and "unreadable" in garbled.error
    assert not fine.has_error()
    assert held_fill(buffer) == 20


class _FlakyListener:
    """The agent's listening socket, whose first accept fails as a connection aborted
    before it was taken does."""

    def __init__(self, sock: sk.socket) -> None:
        self.sock = sock
        self.failed = False

    def accept(self) -> tuple[sk.socket, Any]:
        if not self.failed:
            self.failed = True
            raise ConnectionAbortedError(103, "Software caused connection abort")
        return self.sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_a_connection_that_fails_before_or_during_its_request_costs_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: an agent in this process whose first accept fails, and whose first request's
    # read is cut off by a reset peer.
    import edge_client.runtime.agent as agent_module

    buffer = tmp_path / "dev-0.sqlite"
    _fill(buffer, 100)
    reads: list[int] = []

    def read_or_reset(conn: sk.socket) -> bytes:
        reads.append(1)
        if len(reads) == 1:
            raise ConnectionResetError(104, "Connection reset by peer")
        return read_frame(conn)

    monkeypatch.setattr(agent_module, "read_frame", read_or_reset)
    with agent_sockets() as sockets:
        assert sockets is not None
        agent = DeviceAgent(sockets / "a.sock")
        agent.start()
        listener = _FlakyListener(agent._sock)  # type: ignore[arg-type]
        agent._sock = listener  # type: ignore[assignment]
        try:
            context = _context(buffer, sockets / "a.sock")
            # Execute: the cut-off request, then a round.
            cut = make_client_app()(_train_message(buffer), context)
            fine = make_client_app()(_train_message(buffer, 2), context)
            alive = agent._thread.is_alive()
        finally:
            agent.stop()
    # Assert: the failed accept and the reset request cost their callers only.
    assert listener.failed and len(reads) == 2
    assert cut.has_error() and "failed mid-message" in str(cut.error.reason)
    assert not fine.has_error() and alive
    assert held_fill(buffer) == 20


def held_fill(buffer: Path) -> int:
    with BufferStore(buffer) as store:
        return int(store.stats()["fill"])


def test_a_users_app_trains_through_the_agent_from_its_own_directory(
    tmp_path: Path,
    fast: Callable[..., RunSettings],
    agents: Callable[[int], dict[str, Path]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: examples/activity-app importable here (as Flower installs a FAB), its
    # ClientApp (the task by import path), and an agent that has never seen the app.
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from activity_app.client_app import app as users_app
    from activity_app.task import ActivityTask

    sockets = agents(2)
    settings = fast(num_rounds=2, local_steps=5, sample_shape="3,50", num_classes=4)
    devices = [
        VirtualDevice(f"dev-{i}", rate=20_000, agent=str(sockets[f"dev-{i}"])) for i in range(2)
    ]
    grid = InProcessGrid(devices, tmp_path / "b", settings, users_app, step_time=step_time)
    # Execute
    records = rounds_only(run_rounds(grid, settings, task=ActivityTask()))
    # Assert: both rounds trained on the agents, which loaded the app's task from its directory.
    assert len(records) == 2 and not any(r.failed for r in records)
    assert all(e.agent_cpu_s > 0 for e in records[-1].devices.values())
    log = (tmp_path / "logs" / "agent-dev-0.log").read_text()
    assert f"app {EXAMPLE}" in log and "activity_app.task:ActivityTask" in log


def test_an_agent_stops_cleanly_on_sigterm_and_removes_its_socket(
    procs: ProcessGroup, agents: Callable[[int], dict[str, Path]]
) -> None:
    # Prepare
    socket = agents(1)["dev-0"]
    proc = procs.procs["agent-dev-0"]
    # Execute
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    code = proc.wait(timeout=30)
    # Assert: a clean stop, its socket removed.
    assert code == 0 and not socket.exists() and time.monotonic() - t0 < 30


def test_infer_serves_as_the_devices_agent_and_predicts_while_rounds_train(
    tmp_path: Path, procs: ProcessGroup, broker: Any
) -> None:
    # Prepare: a model version for inference, a buffer for training, and `fedstream infer`
    # serving the agent's socket too (one torch process for both).
    models = tmp_path / "models"
    settings = RunSettings(model_width=8)
    task = Classification(width=8)
    model = init_model(task, settings.shape, settings.num_classes, 0)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    store_model(models, task, settings, weights, 1, "dev-0", None)
    buffer = tmp_path / "dev-0.sqlite"
    _fill(buffer, 200)
    with agent_sockets() as sockets:
        assert sockets is not None
        socket = sockets / "agent.sock"
        log = tmp_path / "infer.log"
        procs.start(
            "infer",
            fedstream_command(
                "infer", "--broker", broker.url, "--device-id", "dev-0", "--model", str(models),
                "--drift", "none", "--agent-socket", str(socket),
            ),
            log_path=log,
        )  # fmt: skip
        assert wait_until(lambda: "connected to" in log.read_text() and socket.exists(), 60)
        probe = MqttProbe(broker.url, "probe")
        probe.subscribe(predictions_topic("dev-0"))
        # Execute: a round through the agent, then samples on the stream.
        reply = make_client_app()(_train_message(buffer), _context(buffer, socket))
        x = np.random.default_rng(0).normal(size=(4, *settings.shape))
        probe.publish(samples_topic("dev-0"), encode_frame(x, np.zeros(4, int), np.arange(4.0)))
        # Assert: the round trained in the inference daemon's process, which predicted too.
        assert not reply.has_error()
        assert DeviceReply.from_content(reply.content).metrics.agent_cpu_s > 0
        assert wait_until(lambda: len(probe.messages) > 0, 30), log.read_text()
        assert json.loads(probe.messages[0].payload)["model-version"] == 1
        probe.close()


SWAP_TASK = """
import torch
from edge_client.task.interface import Classification


class Scored(Classification):
    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.full((len(targets),), {score})


def make() -> Scored:
    return Scored("mlp", 16)
"""


def test_each_run_loads_its_own_apps_code_in_the_same_agent(
    tmp_path: Path, agents: Callable[[int], dict[str, Path]]
) -> None:
    # Prepare: two versions of one app (same package name), each scoring every sample alike.
    for version, score in (("v1", 0.25), ("v2", 0.75)):
        package = tmp_path / version / "swapapp"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "task.py").write_text(SWAP_TASK.format(score=score))
    buffer = tmp_path / "buffers" / "dev-0.sqlite"
    buffer.parent.mkdir(parents=True)
    _fill(buffer, 400)
    socket = agents(1)["dev-0"]
    context = _context(buffer, socket)

    def run(run_id: int, version: str) -> float:
        request = AgentRequest(
            "train", _train_message(buffer, run_id), run_id, context.node_config,
            context.run_config, task="swapapp.task:make", app_dir=str(tmp_path / version),
        )  # fmt: skip
        reply = send_request(socket, request, timeout=60)
        assert reply.message is not None, reply.error
        return DeviceReply.from_content(reply.message.content).metrics.eval_metric

    # Execute: run 1 on v1, run 2 on v2, then run 3 on v1 again, without restarting the agent.
    scores = [run(1, "v1"), run(2, "v2"), run(3, "v1")]
    # Assert: each run scored with its own version's code.
    assert scores == [0.25, 0.75, 0.25]
