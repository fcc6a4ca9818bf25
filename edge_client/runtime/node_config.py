"""A SuperNode's ``--node-config``: which device it is, where its buffer is, how it runs.

``flower-supernode --node-config "device-id='pi-1' buffer='/var/lib/fedstream/pi-1.sqlite'"``
with, optionally, ``slowdown`` (>= 1: stretches each training step, to emulate a slower
device), ``threads`` (torch intra-op threads; 0 leaves torch's default) and ``inject``
(the device takes part in ScaDLES data injection; its ingest daemon runs with ``--inject``)
and ``model-dir`` (where the ClientApp keeps each global model it receives as a versioned
export, for ``fedstream infer --model``; empty: not kept), ``drift`` (``adwin``: watch the
prequential error of the samples each round trains on for changes,
:mod:`edge_client.runtime.drift_watch`; ``none``: not here, e.g. because ``fedstream infer``
watches every sample), ``drift-delta`` (ADWIN's confidence) and ``agent`` (the Unix socket
of the device's ``fedstream agent``: the ClientApp hands each message to it instead of
loading torch itself; empty: it trains in its own process) and ``secagg-min-peers`` (secure
aggregation: the fewest neighbours, and surviving neighbours at unmasking, the device takes
part with; default 2), and the owner's privacy floor, ``dp-min-noise``, ``dp-max-clip``
and ``secure-required`` (:meth:`NodeConfig.plan_refusal`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from edge_client.runtime.drift_watch import DEFAULT_DELTA, DETECTORS
from edge_client.wire.mapping import MappingError, from_mapping, kebab, to_mapping
from edge_client.wire.topics import validate_device_id

__all__ = ["NodeConfig"]


@dataclass(frozen=True)
class NodeConfig:
    """One device's node config (keys: the fields in kebab case)."""

    device_id: str
    buffer: str
    slowdown: float = 1.0
    threads: int = 0
    inject: bool = False
    model_dir: str = ""
    drift: str = "none"
    drift_delta: float = DEFAULT_DELTA
    agent: str = ""
    #: Secure aggregation: the fewest neighbours (and surviving neighbours at unmasking)
    #: this device takes part with; fewer, it refuses the stage (the plan is the
    #: aggregator's, and a smaller neighbourhood tells it more of one device's update).
    secagg_min_peers: int = 2
    #: The owner's floor under privacy (the plan is the aggregator's): the least local DP
    #: noise (a multiple of the clip) its updates leave with, the largest clip, and whether
    #: they go only securely aggregated; a plan below any is refused (0 / False: no floor).
    dp_min_noise: float = 0.0
    dp_max_clip: float = 0.0
    secure_required: bool = False

    def __post_init__(self) -> None:
        validate_device_id(self.device_id)
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1.0):
            raise ValueError(f"slowdown must be >= 1, got {self.slowdown}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.secagg_min_peers < 1:
            raise ValueError(f"secagg-min-peers must be >= 1, got {self.secagg_min_peers}")
        for name in ("dp_min_noise", "dp_max_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{kebab(name)} must be a number >= 0, got {value}")

    def plan_refusal(self, dp_noise: float, dp_clip: float, secure: bool) -> str:
        """Why this device's owner refuses a plan of this local noise, clip and secure
        aggregation ('' when it takes it)."""
        if self.secure_required and not secure:
            return "secure aggregation is required here (node config secure-required)"
        if dp_noise < self.dp_min_noise:
            return (
                f"local DP noise {dp_noise:g} x the clip is below this device's floor "
                f"{self.dp_min_noise:g} (node config dp-min-noise)"
            )
        if self.dp_max_clip > 0 and not 0 < dp_clip <= self.dp_max_clip:
            return (
                f"clip {dp_clip:g} (0: none) is above this device's ceiling "
                f"{self.dp_max_clip:g} (node config dp-max-clip)"
            )
        return ""
        if self.drift not in DETECTORS:
            raise ValueError(f"drift must be one of {DETECTORS}, got {self.drift!r}")
        if not 0 < self.drift_delta < 1:
            raise ValueError(f"drift-delta must lie in (0, 1), got {self.drift_delta}")

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> NodeConfig:
        """Read it from Flower's ``context.node_config`` (other keys are Flower's own).

        Raises
        ------
        ValueError
            If ``device-id`` or ``buffer`` is missing or a value is bad.
        """
        try:
            return from_mapping(cls, node_config)
        except MappingError as err:
            raise ValueError(
                f"node config: {err} (flower-supernode --node-config "
                "\"device-id='pi-1' buffer='/path/pi-1.sqlite'\")"
            ) from err

    @classmethod
    def given_in(cls, node_config: Mapping[str, Any]) -> bool:
        """Whether ``node_config`` names a device (its required keys are there)."""
        return all(
            kebab(f.name) in node_config
            for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING
        )

    def to_node_config(self) -> dict[str, Any]:
        """The keys and values to pass as ``--node-config``."""
        return to_mapping(self)
