"""One secure round the way the ServerApp runs it, in process, against devices whose
messages and replies a test can watch, drop or tamper with (the secure-aggregation tests'
harness)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message
from flwr.common.constant import ErrorCode

from aggregator.exchange import exchange
from aggregator.secure_round import SECAGG_MESSAGE, SecureRound
from aggregator.session import RunSession
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.runtime.client_app import app as client_app
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.node_config import NodeConfig
from edge_client.wire import masking
from edge_client.wire.records import CONFIG
from edge_client.wire.run_config import RunSettings
from edge_client.wire.secagg_records import stage_of

__all__ = ["SECURE", "Devices", "Fast", "assert_step", "config_of", "expected_step", "one_round"]

Fast = Callable[..., RunSettings]
#: A secure run's keys: fixed batches, no probe.
SECURE = {"secure_aggregation": True, "controller": "fixed", "controller_probe": 0}


@dataclass
class Devices:
    """A ClientApp that records what each device kept and every reply, and can make a
    device drop out or misbehave at a stage."""

    drop: dict[str, str] = field(default_factory=dict)  # device -> stage it vanishes at
    tamper: dict[str, Callable[[str, Message, Message], Message]] = field(default_factory=dict)
    tamper_ask: dict[str, Callable[[str, Message], Message]] = field(default_factory=dict)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    replies: list[Message] = field(default_factory=list)
    node: dict[str, dict[str, Any]] = field(default_factory=dict)  # node-config keys set

    def __call__(self, msg: Message, context: Context) -> Message:
        device = NodeConfig.from_node_config(context.node_config).device_id
        context.node_config.update(self.node.get(device, {}))
        stage = "train"
        if msg.metadata.message_type == SECAGG_MESSAGE:
            stage = stage_of(msg.content)[0]
        if self.drop.get(device) == stage:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "gone"), reply_to=msg)
        if device in self.tamper_ask:
            msg = self.tamper_ask[device](stage, msg)
        reply = client_app(msg, context)
        if stage == "train":  # what it keeps to mask: the test's ground truth
            with DeviceStateStore(NodeConfig.from_node_config(context.node_config).buffer) as s:
                kept = s.secure_input()
            if kept:
                self.inputs[device] = np.frombuffer(kept, "<u8").copy()
        if device in self.tamper:
            reply = self.tamper[device](stage, msg, reply)
        self.replies.append(reply)
        return reply


def one_round(
    tmp_path: Path, fast: Fast, app: Devices, devices: int = 6, **keys: Any
) -> tuple[RunSession, dict[str, np.ndarray] | None, Any]:
    """Run round 1 the way the ServerApp does; return the session, the step taken (None
    when skipped) and the report."""
    settings = fast(**{**SECURE, "num_rounds": 1, **keys})
    grid = InProcessGrid(
        [VirtualDevice(f"dev-{i}", rate=20_000) for i in range(devices)],
        tmp_path / "buffers",
        settings,
        client_app=app,  # type: ignore[arg-type]
    )
    try:
        session = RunSession.open(settings)
        messages = list(session.strategy.configure_train(1, session.arrays, ConfigRecord(), grid))
        done = exchange(grid, messages, 60)
        arrays, report = SecureRound(grid, session.strategy).run(done.replies, done.sent)
    finally:
        grid.close()
    if arrays is None:
        return session, None, report
    step = {k: arrays[k].numpy() - session.arrays[k].numpy() for k in session.arrays}
    return session, step, report


def expected_step(
    app: Devices, survivors: list[str], session: RunSession, steps: int
) -> dict[str, np.ndarray]:
    """FedNova's step from the survivors' own quantised inputs, without any masking."""
    settings = session.settings
    total = sum(app.inputs[d] for d in survivors)
    summed = masking.dequantise_sum(
        np.asarray(total, np.uint64), len(survivors), settings.secagg_range, settings.secagg_bits
    )
    shapes = session.strategy.current_round.shapes
    return {k: v * steps / len(survivors) for k, v in masking.unflatten(summed, shapes).items()}


def assert_step(step: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for key, value in expected.items():
        np.testing.assert_allclose(step[key], value, rtol=1e-5, atol=1e-6)


def config_of(msg: Message) -> Any:
    """A message's config record, as the tests read and tamper with it."""
    return msg.content.config_records[CONFIG]
