"""Virtual devices of Flower's simulation engine, fed by replayed streams.

In the simulation engine a node has only ``partition-id``: it becomes the virtual device
``sim-<partition-id>``, whose buffer a replayed stream of the synthetic task (of the run's
``sample-shape`` and ``num-classes``) tops up before each round
(:func:`~edge_client.emulation.replay.replay_into`) at the rate, and trains with the
slowdown, that the run config's ``sim-rates`` and ``sim-slowdowns`` give it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.common.constant import PARTITION_ID_KEY

from edge_client.emulation.replay import replay_into
from edge_client.emulation.sources import pick_classes
from edge_client.runtime.constants import DEFAULT_CAPACITY
from edge_client.runtime.node_config import NodeConfig
from edge_client.wire.run_config import RunSettings, number_list

__all__ = ["simulated_node"]


def simulated_node(
    node_config: Mapping[str, Any], run_id: int, settings: RunSettings
) -> NodeConfig:
    """The virtual device of a simulation node, its buffer topped up to now.

    Parameters
    ----------
    node_config : Mapping
        Flower's node config (``partition-id``).
    run_id : int
        The Flower run (buffers are kept per run under ``sim-dir``).
    settings : RunSettings
        The run's settings (``sim-*`` keys, ``seed``).

    Returns
    -------
    NodeConfig
        Device ``sim-<partition-id>``, its buffer under ``sim-dir``, its slowdown.

    Raises
    ------
    ValueError
        If the run's ``dataset`` is not the synthetic task (the only one replayed here).
    """
    if settings.dataset != "synthetic":
        raise ValueError(
            f"the simulation engine replays the synthetic task (sample-shape "
            f"{settings.sample_shape}), not dataset {settings.dataset!r}"
        )
    pid = int(node_config[PARTITION_ID_KEY])
    device_id = f"sim-{pid}"
    rates = number_list(settings.sim_rates, "sim-rates", 1e-9)
    slowdowns = number_list(settings.sim_slowdowns, "sim-slowdowns", 1.0)
    root = Path(settings.sim_dir or Path(tempfile.gettempdir()) / "fedstream-sim")
    path = root / f"run-{run_id}" / f"{device_id}.sqlite"
    k = settings.sim_labels
    replay_into(
        path,
        device_id,
        rates[pid % len(rates)],
        initial=settings.sim_initial,
        capacity=DEFAULT_CAPACITY,
        seed=settings.seed,
        labels=pick_classes(k, settings.num_classes, index=pid) if k else None,
        dirichlet=settings.sim_dirichlet or None,
        feature_shift=settings.sim_feature_shift,
        shape=settings.shape,
        num_classes=settings.num_classes,
    )
    return NodeConfig(device_id, str(path), slowdown=slowdowns[pid % len(slowdowns)])
