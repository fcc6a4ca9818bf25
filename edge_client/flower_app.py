"""fedstream's ClientApp as Flower loads it (``pyproject.toml``'s ``clientapp``): on real
devices and on the simulation engine.

This module sits above both the runtime and the stream emulation: it composes the runtime's
ClientApp (:func:`~edge_client.runtime.client_app.compose_client_app`) with the emulation's
virtual devices (:class:`~edge_client.emulation.simulation.SimulationNodes`) behind the
runtime's hook (:mod:`edge_client.runtime.virtual_nodes`). The emulation is imported at the
first virtual node only: a real device never loads it. The runtime never imports this
module or the emulation.

A Flower app around a user's own task that should also run on the simulation engine takes
:func:`make_client_app` from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.clientapp import ClientApp

from edge_client.runtime.client_app import absent_reply, compose_client_app
from edge_client.runtime.virtual_nodes import VirtualNodes, provide_virtual_nodes

if TYPE_CHECKING:
    from edge_client.task.interface import Task

__all__ = ["absent_reply", "app", "make_client_app"]


def _simulation_nodes() -> VirtualNodes:
    from edge_client.emulation.simulation import SimulationNodes  # the simulation engine only

    return SimulationNodes()


def make_client_app(task: Task | str | None = None) -> ClientApp:
    """:func:`edge_client.runtime.client_app.make_client_app` (the same parameters), with the
    simulation engine's virtual devices: for ``flwr run`` on a simulation federation too."""
    return compose_client_app(task, _simulation_nodes)


# In this process too (absent_reply called directly, as tests do).
provide_virtual_nodes(_simulation_nodes)

#: fedstream's own ClientApp: the task the run config names.
app = make_client_app()
