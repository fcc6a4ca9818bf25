"""The device a ClientApp message is for, and its buffer and state, in a process that
need not import torch (the training round and secure aggregation's stages share it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flwr.app import Context

from edge_client.runtime.buffer import BufferStore, SampleBuffer
from edge_client.runtime.device_state import DeviceState, DeviceStateStore
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.virtual_nodes import is_virtual, virtual_nodes
from edge_client.wire.run_config import RunSettings

__all__ = ["node_of", "open_device"]


def node_of(context: Context, settings: RunSettings, server_round: int) -> NodeConfig:
    """This node's device: from its node config, or a virtual one in the simulation engine."""
    if not is_virtual(context):
        return NodeConfig.from_node_config(context.node_config)
    return virtual_nodes().node(context.node_config, context.run_id, settings, server_round)


@contextlib.contextmanager
def open_device(
    context: Context, settings: RunSettings, node: NodeConfig, server_round: int
) -> Iterator[tuple[SampleBuffer, DeviceState]]:
    """The device's buffer and state: its buffer file, or a virtual device's lazy buffer and
    state in its ``context.state`` (``sim-buffers = "lazy"``), as of ``server_round``."""
    if is_virtual(context) and settings.sim_buffers == "lazy":
        virtual = virtual_nodes()
        with virtual.open_device(
            context.node_config, settings, context.state, server_round
        ) as device:
            yield device
    else:
        with BufferStore(node.buffer) as store, DeviceStateStore(node.buffer) as state:
            yield store, state
