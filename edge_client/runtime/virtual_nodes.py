"""The simulation engine's virtual devices, as the ClientApp sees them: a hook.

In Flower's simulation engine a node has only ``partition-id``; the ClientApp makes it a
virtual device through the :class:`VirtualNodes` provided here: whether it is away now, its
:class:`~edge_client.runtime.node_config.NodeConfig`, its buffer and device state, and what
its steps cost on the virtual clock.

The runtime only defines the hook. The stream emulation implements it
(:class:`edge_client.emulation.simulation.SimulationNodes`) and the app Flower loads,
:mod:`edge_client.flower_app`, provides it: so the runtime never imports the emulation (the
emulation builds on the runtime), and a real device, which never meets a virtual node,
never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flwr.app import Context, RecordDict

    from edge_client.runtime.buffer import SampleBuffer
    from edge_client.runtime.device_state import DeviceState
    from edge_client.runtime.injection import Post
    from edge_client.runtime.node_config import NodeConfig
    from edge_client.wire.run_config import RunSettings

__all__ = [
    "VirtualNodes",
    "VirtualNodesError",
    "is_virtual",
    "provide_virtual_nodes",
    "virtual_nodes",
]


class VirtualNodes(Protocol):
    """What makes a simulation node (``partition-id`` only) a device."""

    def absence(
        self,
        node_config: Mapping[str, Any],
        settings: RunSettings,
        state: RecordDict,
        server_round: int,
        stage: str = "",
    ) -> str:
        """Why the virtual device is away at round ``server_round`` (empty: it is there);
        ``stage``: the secure-aggregation stage asked of it (empty: training)."""
        ...

    def node(
        self,
        node_config: Mapping[str, Any],
        run_id: int,
        settings: RunSettings,
        server_round: int,
    ) -> NodeConfig:
        """The virtual device at round ``server_round``: its id, buffer file, slowdown and
        threads."""
        ...

    def open_device(
        self,
        node_config: Mapping[str, Any],
        settings: RunSettings,
        state: RecordDict,
        server_round: int,
    ) -> AbstractContextManager[tuple[SampleBuffer, DeviceState]]:
        """Its buffer at round ``server_round`` and device state, kept in ``state``
        (``sim-buffers = "lazy"``)."""
        ...

    def receive_shared(
        self, node: NodeConfig, settings: RunSettings, state: DeviceState, server_round: int
    ) -> None:
        """Receive into the device's injection pool what others shared before round
        ``server_round`` (nothing unless it opted in)."""
        ...

    def post_shared(self, node: NodeConfig, server_round: int) -> Post:
        """Where the samples the device shares in round ``server_round`` go."""
        ...

    def step_s(self, node: NodeConfig, batch: int) -> float:
        """Seconds one SGD step of ``batch`` samples takes the virtual device on the virtual
        clock: what it reports instead of the wall time it took, so that plans repeat."""
        ...


class VirtualNodesError(RuntimeError):
    """A simulation node reached a ClientApp loaded without virtual devices."""


_factory: Callable[[], VirtualNodes] | None = None
_nodes: VirtualNodes | None = None


def provide_virtual_nodes(factory: Callable[[], VirtualNodes] | None) -> None:
    """Provide this process's virtual devices: ``factory`` runs at the first simulation
    node (so a process that never meets one never loads what it needs); None withdraws it.
    Providing the same factory again keeps what it made."""
    global _factory, _nodes
    if factory is not _factory:
        _factory, _nodes = factory, None


def virtual_nodes() -> VirtualNodes:
    """This process's virtual devices.

    Raises
    ------
    VirtualNodesError
        If none were provided: the ClientApp was loaded as ``edge_client.runtime.client_app``
        rather than ``edge_client.flower_app``, which the simulation engine needs.
    """
    global _nodes
    if _nodes is None:
        if _factory is None:
            raise VirtualNodesError(
                "this node has only Flower's partition-id (the simulation engine), and no "
                "virtual devices were provided: load the ClientApp as edge_client.flower_app:app"
            )
        _nodes = _factory()
    return _nodes


def is_virtual(context: Context) -> bool:
    """Whether this node is a simulation engine's (only Flower's ``partition-id``, no device
    in its node config)."""
    from flwr.common.constant import PARTITION_ID_KEY

    from edge_client.runtime.node_config import NodeConfig

    node = context.node_config
    return not NodeConfig.given_in(node) and PARTITION_ID_KEY in node
