"""The round protocol between the aggregator and a device: record names and keys.

Server -> device: a ``ConfigRecord`` named ``config`` (the device's plan for the round) and
the global model as an ``ArrayRecord`` named ``arrays`` (float32, or float16 when the
broadcast is compressed). Device -> server: a ``ConfigRecord`` named ``update`` whose
``frame`` holds the model delta coded by :mod:`edge_client.codec`, a ``MetricRecord`` named
``metrics``, and a ``ConfigRecord`` named ``device`` holding ``device-id`` (metrics may only
hold numbers). Keys are kebab-case, as Flower's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, MetricRecord

from edge_client.constants import DEFAULT_TOPK_RATIO
from edge_client.trainer import LocalPlan, TrainResult

__all__ = [
    "ARRAYS",
    "CONFIG",
    "DEVICE",
    "FRAME",
    "METRICS",
    "UPDATE",
    "metrics_record",
    "plan_from_config",
    "plan_to_config",
]

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
DEVICE = "device"
UPDATE = "update"
FRAME = "frame"


def plan_to_config(plan: LocalPlan, server_round: int) -> ConfigRecord:
    """The ``config`` record that carries ``plan`` to a device."""
    return ConfigRecord(
        {
            "server-round": server_round,
            "batch-size": plan.batch_size,
            "local-steps": plan.local_steps,
            "lr": plan.lr,
            "wait-policy": plan.wait_policy,
            "b-min": plan.b_min,
            "deadline-s": plan.deadline_s,
            "proximal-mu": plan.proximal_mu,
            "compress": plan.compress,
            "compress-ratio": plan.compress_ratio,
            "inject-mix": plan.inject_mix,
            "inject-publish": plan.inject_publish,
            "inject-beta": plan.inject_beta,
            "inject-budget": plan.inject_budget,
        }
    )


def plan_from_config(config: Mapping[str, Any]) -> LocalPlan:
    """Read a device's plan from its ``config`` record.

    Raises
    ------
    ValueError
        If a key is missing or a value is out of range.
    """
    try:
        return LocalPlan(
            batch_size=int(config["batch-size"]),
            local_steps=int(config["local-steps"]),
            lr=float(config["lr"]),
            wait_policy=str(config.get("wait-policy", "adapt")),
            b_min=int(config.get("b-min", 1)),
            deadline_s=float(config.get("deadline-s", 60.0)),
            proximal_mu=float(config.get("proximal-mu", 0.0)),
            compress=str(config.get("compress", "none")),
            compress_ratio=float(config.get("compress-ratio", DEFAULT_TOPK_RATIO)),
            inject_mix=float(config.get("inject-mix", 0.0)),
            inject_publish=bool(config.get("inject-publish", False)),
            inject_beta=float(config.get("inject-beta", 0.0)),
            inject_budget=int(config.get("inject-budget", 0)),
        )
    except KeyError as err:
        raise ValueError(f"round plan lacks {err.args[0]!r}") from err


def metrics_record(
    result: TrainResult,
    buffer: Mapping[str, Any],
    bytes_up: int,
    gap: float | None = None,
    injection: Mapping[str, int] | None = None,
) -> MetricRecord:
    """The ``metrics`` record of a training reply.

    ``gap`` is the top-k gap EWMA, if known; ``injection`` holds ``inject-opt-in``,
    ``inject-bytes`` and ``inject-samples`` (what this device queued for sharing).
    """
    record = MetricRecord(
        {
            "num-examples": result.num_examples,
            "batch-size": result.batch_size,
            "local-steps": result.local_steps,
            "compute-s": result.compute_s,
            "step-s": result.step_s,
            "wait-s": result.wait_s,
            "train-loss": result.train_loss,
            "stream-rate": float(buffer.get("rate", 0.0)),
            "buffer-fill": int(buffer.get("fill", 0)),
            "buffer-dropped": int(buffer.get("dropped", 0)),
            "bytes-up": bytes_up,
        }
    )
    if gap is not None:
        record["compress-gap"] = gap
    record["inject-used"] = result.inject_used
    for key, value in (injection or {}).items():
        record[key] = value
    return record
