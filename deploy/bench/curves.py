"""What a controller run's records say (``fedstream bench deployment``): each device's batches
and compute round by round, the slowest device's share of a round spent training, and the
wall time to an accuracy."""

from __future__ import annotations

import statistics

from aggregator.round_log import RoundRecord

__all__ = ["batch_per_device", "compute_per_device", "slowest_share", "time_to"]


def compute_per_device(records: list[RoundRecord]) -> dict[str, list[float]]:
    """Each device's steady-state compute seconds, round by round."""
    names = sorted({d for r in records for d in r.devices})
    return {d: [round(r.devices[d].compute_s, 3) for r in records if d in r.devices] for d in names}


def batch_per_device(records: list[RoundRecord]) -> dict[str, list[int]]:
    """Each device's trained batch, round by round."""
    names = sorted({d for r in records for d in r.devices})
    return {d: [r.devices[d].batch_size for r in records if d in r.devices] for d in names}


def time_to(records: list[RoundRecord], target: float) -> float | None:
    """The run's wall seconds when its test accuracy first reached ``target`` (None: never)."""
    return next((r.run_wall_s for r in records if r.test_accuracy >= target), None)


def slowest_share(records: list[RoundRecord], devices: int) -> float | None:
    """The median share of a round's wall time the slowest device (the last) trained (its
    local steps, warm-up and emulated slowdown included: ``train_s``)."""
    slowest = f"dev-{devices - 1}"
    shares = [r.devices[slowest].train_s / r.wall_s for r in records if slowest in r.devices]
    return round(statistics.median(shares), 3) if shares else None
