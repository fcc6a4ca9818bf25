"""The aggregator's run settings, read and checked from Flower's run config."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from aggregator.controller import ControllerConfig
from edge_client.constants import (
    AGGREGATIONS,
    BROADCAST_MODES,
    COMPRESS_MODES,
    DATASETS,
    DEFAULT_ADAPTIVE_DELTA,
    DEFAULT_INJECT_BETA,
    DEFAULT_INJECT_BUDGET,
    DEFAULT_INJECT_MIX,
    DEFAULT_KRUM_MALICIOUS,
    DEFAULT_TOPK_RATIO,
    DEFAULT_TRIM_FRACTION,
    DIGITS_CLASSES,
    MODELS,
    WAIT_POLICIES,
)
from edge_client.replay import parse_profile

__all__ = ["RunSettings"]

MAX_INT = 10**7  # no count in a run config (rounds, steps, batch, samples) is anywhere near
MAX_EVAL_SAMPLES = 100_000  # the held-out set is built in memory


@dataclass(frozen=True)
class RunSettings:
    """Every tunable of a run; the kebab-case run-config key is the field name with dashes.

    Defaults here match ``[tool.flwr.app.config]`` in pyproject.toml.
    """

    num_rounds: int = 10
    local_steps: int = 20
    global_batch: int = 128
    b_min: int = 8
    b_max: int = 256
    deadband: float = 0.1
    controller_period: int = 1
    controller: str = "dynamic"
    lr: float = 0.05
    model: str = "cnn"
    num_classes: int = 6
    dataset: str = "synthetic"  # what the streams carry (edge_client.datasets)
    wait_policy: str = "adapt"
    availability_cap: bool = True  # ScaDLES: no batch above fill + rate * round time
    round_timeout: float = 120.0
    min_nodes: int = 1
    checkpoint_dir: str = ""
    resume: bool = False
    out_dir: str = ""
    eval_samples: int = 2000
    uplink_mbps: float = 10.0
    seed: int = 0
    # Update compression (edge_client.codec): mode, top-k ratio, ScaDLES delta, broadcast.
    compress: str = "none"
    compress_ratio: float = DEFAULT_TOPK_RATIO
    compress_delta: float = DEFAULT_ADAPTIVE_DELTA
    compress_broadcast: str = "none"
    # Non-IID mitigation: FedProx, and ScaDLES data injection among opted-in devices.
    proximal_mu: float = 0.0
    inject_alpha: float = 0.0  # fraction of opted-in devices that share each round; 0: off
    inject_beta: float = DEFAULT_INJECT_BETA
    inject_budget: int = DEFAULT_INJECT_BUDGET
    inject_mix: float = DEFAULT_INJECT_MIX
    # Byzantine-robust aggregation (aggregator.robust); fedavg streams in O(model) memory.
    aggregation: str = "fedavg"
    trim_fraction: float = DEFAULT_TRIM_FRACTION
    krum_malicious: int = DEFAULT_KRUM_MALICIOUS
    # Flower simulation only: virtual devices' streams and speeds (read by the ClientApp).
    sim_dir: str = ""
    sim_rates: str = "400,400,200,100"
    sim_slowdowns: str = "1,1,2,4"
    sim_initial: int = 2000
    sim_labels: int = 0  # pathological skew: classes per virtual device; 0: none
    sim_dirichlet: float = 0.0  # Dirichlet label skew alpha; 0: none
    sim_feature_shift: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name.replace('_', '-')} must be finite, got {value}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                raise ValueError(f"{f.name.replace('_', '-')} is out of range: {value}")
        if not 1 <= self.eval_samples <= MAX_EVAL_SAMPLES:
            raise ValueError(f"eval-samples must be in 1..{MAX_EVAL_SAMPLES}")
        self.controller_config()  # validates the controller fields
        if self.num_rounds < 1 or self.local_steps < 1:
            raise ValueError("num-rounds and local-steps must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.wait_policy not in WAIT_POLICIES:
            raise ValueError(f"wait-policy must be one of {WAIT_POLICIES}")
        if self.min_nodes < 1:
            raise ValueError(f"min-nodes must be >= 1, got {self.min_nodes}")
        if not self.round_timeout > 0:
            raise ValueError(f"round-timeout must be > 0, got {self.round_timeout}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {self.dataset!r}")
        if self.dataset == "digits" and self.num_classes != DIGITS_CLASSES:
            raise ValueError(f"dataset digits has {DIGITS_CLASSES} classes: set num-classes=10")
        if self.compress not in COMPRESS_MODES:
            raise ValueError(f"compress must be one of {COMPRESS_MODES}, got {self.compress!r}")
        if not 0 < self.compress_ratio <= 1:
            raise ValueError(f"compress-ratio must be in (0, 1], got {self.compress_ratio}")
        if not 0 <= self.compress_delta <= 1:
            raise ValueError(f"compress-delta must be in [0, 1], got {self.compress_delta}")
        if not (self.proximal_mu >= 0 and self.inject_budget >= 0):
            raise ValueError("proximal-mu and inject-budget must be >= 0")
        if not (0 <= self.inject_alpha <= 1 and 0 <= self.inject_beta <= 1):
            raise ValueError("inject-alpha and inject-beta must be in [0, 1]")
        if not 0 <= self.inject_mix < 1:
            raise ValueError(f"inject-mix must be in [0, 1), got {self.inject_mix}")
        if not (0 <= self.sim_labels <= self.num_classes and self.sim_dirichlet >= 0):
            raise ValueError("sim-labels must be in 0..num-classes and sim-dirichlet >= 0")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if not 0 <= self.trim_fraction < 0.5:
            raise ValueError(f"trim-fraction must be in [0, 0.5), got {self.trim_fraction}")
        if self.krum_malicious < 0:
            raise ValueError(f"krum-malicious must be >= 0, got {self.krum_malicious}")
        if self.compress_broadcast not in BROADCAST_MODES:
            raise ValueError(f"compress-broadcast must be one of {BROADCAST_MODES}")
        parse_profile(self.sim_rates, "sim-rates", 1e-9)
        parse_profile(self.sim_slowdowns, "sim-slowdowns", 1.0)

    def controller_config(self) -> ControllerConfig:
        """The batch controller's part."""
        return ControllerConfig(
            global_batch=self.global_batch,
            b_min=self.b_min,
            b_max=self.b_max,
            deadband=self.deadband,
            period=self.controller_period,
            mode=self.controller,
        )

    def to_run_config(self) -> dict[str, Any]:
        """The settings as a run config (kebab-case keys): what a resume submits again."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """Read settings from a run config (unknown keys are an error: likely typos).

        Raises
        ------
        ValueError
            On an unknown key or a bad value.
        """
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for key, value in config.items():
            f = known[key]
            kind = type(getattr(cls(), f.name))
            try:
                values[f.name] = _coerce(value, kind)
            except (TypeError, ValueError, OverflowError) as err:
                raise ValueError(f"run-config {key}={value!r}: {err}") from err
        return cls(**values)


def _coerce(value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, str):
            return value.lower() in ("1", "true", "yes")
        return bool(value)
    return kind(value)
