"""The batch controller: per-device mini-batch sizes (OmniLearn) under stream limits (ScaDLES).

OmniLearn's proportional law, per device ``i`` every controller period, is
``b_i' = b_i * t_mean / t_i`` with ``t_i`` the device's step time: a device slower than the
mean gets a smaller batch, a faster one a larger one, until step times are equal. Scaled
so that ``sum(b) == B``, the fixed point is ``b_i = B * v_i / sum(v)`` with ``v_i = b_i / t_i``
the device's throughput (samples/s). The controller keeps, per device, an EWMA of the time
per sample (``t_i / b_i``): the same law, but a batch change does not bias the average.

Around the law:

* **deadband**: when the predicted step times at the current batches are within ``deadband``
  (relative) of each other, the plan is kept; otherwise every device is re-planned. Timing
  noise does not churn the plan, and a plan is never held short of balance (holding some
  devices and re-solving the others around them can stick there for good).
* **bounds**: every batch in ``[b_min, b_max]``; what a clamped device cannot take goes to
  the unclamped ones in proportion to their throughput (water filling).
* **availability (ScaDLES)**: a device's batch never asks for more than it can have in its
  buffer by the end of the round, ``(fill + rate * t_round) / K`` per step for ``K`` local
  steps (the cap is computed by the strategy and passed in per step). If the batches then
  sum to less than the batch the learning rate is meant for (``lr-batch``, or ``B`` when
  smaller), the rate is scaled by ``sum(b)`` over it (linear scaling rule); a device that
  trains a smaller batch than planned scales its own rate down the same way. ``B`` is sized
  for the controller's room (at a small batch a slow device's steps are mostly fixed
  overhead), not for the rate: a capped round that still trains ``lr-batch`` samples a step
  keeps the full rate.
* **integers**: rounded with largest remainders so that ``sum(b) == B`` exactly (or the
  capped total).

Modes: ``fixed`` (equal batches: the FedAvg baseline), ``static`` (proportional to the first
measured throughput, then frozen) and ``dynamic`` (the closed loop above).

The controller is configured by the run settings' controller knobs
(:class:`~edge_client.wire.run_config.ControllerSettings`: ``global-batch``, ``b-min``,
``b-max``, ``lr-batch``, ``deadband``, ``controller-period``, ``controller``,
``controller-smoothing``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edge_client.wire.run_config import ControllerSettings

__all__ = ["BatchController", "DeviceState", "Plan"]

HISTORY = 8  # step-time measurements kept per device
SLOPE_REL_SE = 0.3  # a fitted per-sample cost this uncertain is not trusted
# A step time this far (relative) from the device's fitted cost means its speed changed
# (throttling, another job, a new level): forget its older timings and re-fit from the new.
SPEED_CHANGE = 0.3
# A device whose timings span one batch size trains its next round at two sizes this far
# either side of its batch (RoundPlan.time_spread): the slope, with no extra exchange.
SLOPE_SPREAD = 0.5


@dataclass
class DeviceState:
    """What the controller remembers of one device (kept while the device is away)."""

    batch: int
    history: list[list[float]] = field(default_factory=list)  # [batch, step seconds], newest last
    first_throughput: float | None = None  # samples/s at the first measurement (static mode)
    # The last fit and what it was fitted to: a round asks for it in observe and in plan.
    _fit: tuple[Any, tuple[float, float] | None] = field(
        default=(None, None), repr=False, compare=False
    )

    def cost_model(self, smoothing: float) -> tuple[float, float] | None:
        """``(a, c)`` of the step time ``t(b) = a + c * b`` (see :meth:`_cost_model`),
        remembered until the history or the smoothing changes."""
        key = (smoothing, tuple(map(tuple, self.history)))
        if self._fit[0] != key:
            self._fit = (key, self._cost_model(smoothing))
        return self._fit[1]

    def _cost_model(self, smoothing: float) -> tuple[float, float] | None:
        """``(a, c)`` of the step time ``t(b) = a + c * b``, or None before any measurement.

        A weighted least-squares fit over the recent measurements (weight
        ``(1 - smoothing) ** age``) once they span two batch sizes; before that, or if the
        fit is not physical, ``a = 0`` and ``c`` the weighted time per sample (OmniLearn's
        proportional law).
        """
        if not self.history:
            return None
        pts = np.array(self.history[::-1], dtype=float)  # newest first
        w = (1.0 - smoothing) ** np.arange(len(pts)) if smoothing < 1 else np.eye(len(pts))[0]
        b, t = pts[:, 0], pts[:, 1]
        keep = w > 1e-3
        proportional = (0.0, float(np.sum(w * t) / np.sum(w * b)))
        if len(set(b[keep])) < 2:
            return proportional
        sw = np.sqrt(w[keep])
        design = np.stack([np.ones(keep.sum()), b[keep]], axis=1) * sw[:, None]
        target = t[keep] * sw
        (a, c), *_ = np.linalg.lstsq(design, target, rcond=None)
        if c <= 0 or a < 0:
            return proportional
        # A slope lost in timing noise (steps dominated by fixed overhead) would send the
        # whole global batch to whichever device looks flattest: fall back to the law.
        dof = int(keep.sum()) - 2
        if dof > 0:
            residual = target - design @ np.array([a, c])
            cov = np.linalg.pinv(design.T @ design) * float(residual @ residual) / dof
            if math.sqrt(max(cov[1, 1], 0.0)) > SLOPE_REL_SE * c:
                return proportional
        return float(a), float(c)


@dataclass(frozen=True)
class Plan:
    """One round's batches per device and the learning-rate scale."""

    batches: dict[str, int]
    lr_scale: float = 1.0

    @property
    def total(self) -> int:
        """Sum of the batches."""
        return sum(self.batches.values())


@dataclass
class BatchController:
    """Per-device batch sizes, keyed by device id (stable across SuperNode restarts).

    Parameters
    ----------
    config : ControllerSettings
        The controller's knobs (the run settings themselves will do).
    """

    config: ControllerSettings
    devices: dict[str, DeviceState] = field(default_factory=dict)
    updates: int = 0  # controller periods applied so far

    def observe(self, device_id: str, batch: int, step_seconds: float) -> None:
        """Record a device's steady-state compute time per step at ``batch``.

        Non-positive or non-finite times (a device that trained no step) are ignored.
        """
        if batch <= 0 or not (math.isfinite(step_seconds) and step_seconds > 0):
            return
        state = self.devices.setdefault(device_id, DeviceState(batch=batch))
        if state.first_throughput is None:
            state.first_throughput = batch / step_seconds
        model = state.cost_model(self.config.controller_smoothing)
        if model is not None and len(state.history) >= 2:
            predicted = model[0] + model[1] * batch
            if abs(step_seconds - predicted) > SPEED_CHANGE * predicted:
                state.history = []  # the device changed speed: old timings would mislead
        state.history = [*state.history, [float(batch), float(step_seconds)]][-HISTORY:]

    def time_spread(self, device_id: str) -> float:
        """How far apart the device's next round should time two step sizes
        (:data:`SLOPE_SPREAD`) so its cost model gets a slope: when the controller is
        dynamic and the device's timings span fewer than two batch sizes (a newcomer, one
        whose speed changed, one whose plan has held for :data:`HISTORY` rounds); else 0."""
        if self.config.controller != "dynamic":
            return 0.0
        state = self.devices.get(device_id)
        sizes = {b for b, _ in state.history} if state is not None else set()
        return SLOPE_SPREAD if len(sizes) < 2 else 0.0

    def calibrate(self, device_id: str, timings: Sequence[tuple[int, float]]) -> None:
        """Start a device's timings from a probe: ``(batch, step seconds)`` pairs, largest
        batch first (its throughput is the static mode's). Replaces what was known of it."""
        points = [[float(b), float(t)] for b, t in timings if b > 0 and math.isfinite(t) and t > 0]
        if not points:
            return
        state = self.devices.setdefault(device_id, DeviceState(batch=int(points[0][0])))
        state.history = points[::-1][-HISTORY:]  # newest last: the largest batch weighs most
        state.first_throughput = points[0][0] / points[0][1]

    def plan(
        self,
        device_ids: Sequence[str],
        server_round: int,
        available: Mapping[str, float] | None = None,
    ) -> Plan:
        """Batches for the devices taking part in ``server_round``.

        Parameters
        ----------
        device_ids : sequence of str
            Devices in this round (those not listed keep their state untouched).
        server_round : int
            1-based round; the dynamic law is applied every ``period`` rounds.
        available : mapping of str to float, optional
            Samples per step each device can have by the end of the round (availability
            cap: a batch is never planned above it).

        Returns
        -------
        Plan

        Raises
        ------
        ValueError
            If ``b_min`` times the number of devices exceeds ``B``.
        """
        cfg = self.config
        ids = list(dict.fromkeys(device_ids))
        if not ids:
            return Plan({})
        if cfg.b_min * len(ids) > cfg.global_batch:
            raise ValueError(
                f"{len(ids)} devices x b-min {cfg.b_min} exceed global-batch {cfg.global_batch}"
            )
        caps = available or {}
        upper = {
            d: max(cfg.b_min, min(cfg.b_max, math.floor(caps[d]))) if d in caps else cfg.b_max
            for d in ids
        }
        equal = {d: 1.0 for d in ids}
        for d in ids:
            self.devices.setdefault(d, DeviceState(batch=cfg.global_batch // len(ids)))
        if cfg.controller == "fixed":
            targets = _water_fill(cfg.global_batch, equal, {}, cfg.b_min, upper)
        elif cfg.controller == "static":
            speeds = {d: self.devices[d].first_throughput for d in ids}
            weights = equal if any(v is None for v in speeds.values()) else speeds
            targets = _water_fill(cfg.global_batch, weights, {}, cfg.b_min, upper)  # type: ignore[arg-type]
        else:
            targets = self._dynamic(ids, server_round, upper)
        batches = _round_exact(targets, upper, cfg.b_min)
        for d, b in batches.items():
            self.devices[d].batch = b
        total = sum(batches.values())
        reference = min(cfg.global_batch, cfg.lr_batch or cfg.global_batch)
        return Plan(batches, lr_scale=min(1.0, total / reference))

    def _dynamic(
        self, ids: list[str], server_round: int, upper: dict[str, int]
    ) -> dict[str, float]:
        cfg = self.config
        states = {d: self.devices[d] for d in ids}
        current = {d: float(s.batch) for d, s in states.items()}
        models = {d: s.cost_model(cfg.controller_smoothing) for d, s in states.items()}
        due = (server_round - 1) % cfg.controller_period == 0
        unknown = [d for d, m in models.items() if m is None]
        if len(unknown) == len(ids):  # no timing yet: share B equally
            return _water_fill(cfg.global_batch, {d: 1.0 for d in ids}, {}, cfg.b_min, upper)
        # Equal step times T: b_i = (T - a_i) / c_i, i.e. weight 1/c_i and offset -a_i/c_i.
        # With a_i = 0 this is OmniLearn's law b_i' = b_i * t_mean / t_i, normalised to B.
        fitted = {d: m for d, m in models.items() if m is not None}
        speed = {d: 1.0 / m[1] for d, m in fitted.items()}
        offset = {d: -m[0] / m[1] for d, m in fitted.items()}
        if unknown:  # a newcomer gets an equal share until it has timings; the rest follow
            share = cfg.global_batch / len(ids)
            fixed = {d: min(float(upper[d]), max(float(cfg.b_min), share)) for d in unknown}
            self.updates += 1
            return _water_fill(cfg.global_batch, speed, fixed, cfg.b_min, upper, offset)
        fits = _fits(current, cfg.global_batch, cfg.b_min, upper)
        if not due and fits:
            return current
        ideal = _water_fill(cfg.global_batch, speed, {}, cfg.b_min, upper, offset)
        if fits and _balanced(current, ideal, fitted, cfg.b_min, upper, cfg.deadband):
            return current  # step times already within the deadband: keep the plan
        self.updates += 1
        return ideal  # every device re-planned: holding some would stick short of balance

    def forget(self, device_id: str) -> None:
        """Drop what is known of a device (a placeholder name once its real id is known)."""
        self.devices.pop(device_id, None)

    # -- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (for the aggregator's checkpoint); the config is the run's."""
        return {
            "devices": {
                d: {k: v for k, v in asdict(s).items() if not k.startswith("_")}
                for d, s in self.devices.items()
            },
            "updates": self.updates,
        }

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, Any], config: ControllerSettings
    ) -> BatchController:
        """Rebuild a controller saved with :meth:`state_dict`, configured by ``config``."""
        return cls(
            config=config,
            devices={d: DeviceState(**s) for d, s in state["devices"].items()},
            updates=int(state.get("updates", 0)),
        )


def _balanced(
    current: Mapping[str, float],
    ideal: Mapping[str, float],
    models: Mapping[str, tuple[float, float]],
    lower: int,
    upper: Mapping[str, int],
    deadband: float,
) -> bool:
    """Whether the current batches are as good as a re-plan: the devices the law governs
    (those the ideal plan puts strictly between the bounds) have predicted step times within
    ``deadband`` of each other, and each device the ideal pins at a bound is there (to the
    sample)."""
    governed = [d for d in ideal if lower < ideal[d] < upper[d]]
    pinned = [d for d in ideal if d not in governed]
    if any(abs(current[d] - ideal[d]) > 1.0 for d in pinned):
        return False
    times = [models[d][0] + models[d][1] * current[d] for d in governed]
    return len(times) < 2 or max(times) <= (1.0 + deadband) * min(times)


def _fits(batches: Mapping[str, float], total: int, b_min: int, upper: Mapping[str, int]) -> bool:
    return (
        all(b_min <= b <= upper[d] for d, b in batches.items())
        and abs(sum(batches.values()) - min(total, sum(upper.values()))) < 1e-9
    )


def _water_fill(
    total: int,
    weights: Mapping[str, float],
    fixed: Mapping[str, float],
    lower: int,
    upper: Mapping[str, int],
    offsets: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Split ``total`` over the non-fixed devices as ``clip(lam * weight + offset, lower, upper)``.

    ``lam`` is found by bisection so that the parts sum to ``total``: a device pushed past
    a bound is pinned there and the others share the rest in proportion to their weights.
    When even every upper bound together is short of ``total``, everyone gets its upper bound.
    """
    out = {d: float(v) for d, v in fixed.items()}
    free = [d for d in weights if d not in fixed]
    left = total - sum(out.values())
    if not free:
        return out

    off = offsets or {}

    def parts(lam: float) -> dict[str, float]:
        return {
            d: min(float(upper[d]), max(float(lower), lam * weights[d] + off.get(d, 0.0)))
            for d in free
        }

    hi = 1.0
    while sum(parts(hi).values()) < left and hi < 1e18:
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(parts(mid).values()) < left:
            lo = mid
        else:
            hi = mid
    out.update(parts(hi))
    return out


def _round_exact(
    targets: Mapping[str, float], upper: Mapping[str, int], lower: int
) -> dict[str, int]:
    """Integers within bounds whose sum is the (integer) sum of ``targets``: largest remainders."""
    want = round(sum(targets.values()))
    out = {d: max(lower, min(upper[d], math.floor(v + 1e-9))) for d, v in targets.items()}
    rest = want - sum(out.values())
    order = sorted(targets, key=lambda d: targets[d] - math.floor(targets[d] + 1e-9), reverse=True)
    while rest > 0:
        grown = False
        for d in order:
            if rest and out[d] < upper[d]:
                out[d] += 1
                rest -= 1
                grown = True
        if not grown:
            break
    while rest < 0:
        shrunk = False
        for d in reversed(order):
            if rest and out[d] > lower:
                out[d] -= 1
                rest += 1
                shrunk = True
        if not shrunk:
            break
    return out
