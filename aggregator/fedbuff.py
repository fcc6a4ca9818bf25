"""Buffered asynchronous aggregation (FedBuff): the rule and its bookkeeping.

In asynchronous mode no device waits for the others: the aggregator gives a device new work
as soon as its reply arrives, and a reply's update was trained from whatever model version
the device was sent (:mod:`aggregator.asynchronous` drives it). :class:`UpdateBuffer` holds
the updates that arrive until there are ``size`` of them (FedBuff's K, the run config's
``async-buffer``), then applies them as one step:

    w <- w + server_lr * sum_i(u_i * s(tau_i) * delta_i) / sum_i(u_i)

with ``s(tau_i)`` the weight of update ``i``'s staleness ``tau_i`` (versions applied since
the version it started from) and ``u_i`` its weight as the run's ``aggregation`` gives it:

- ``adaptive`` (the default): ``n / (n + r)`` for its ``n`` samples, the update normalised
  by its local steps and the sum scaled back by the buffer's mean steps, with ``r`` the
  fleet's noise-to-heterogeneity ratio as estimated when the version was started
  (:mod:`aggregator.heterogeneity`; each applied buffer's updates then go into the
  estimate);
- ``fedavg``: the samples it was trained on;
- ``fednova``: 1, the update normalised by its local steps and the sum scaled back by the
  buffer's mean steps (each update counts once, whatever its batch: FedBuff's own rule,
  which weighs every buffered update the same).

Dividing by the ``u_i`` alone, not by the staleness-weighted ones, keeps the staleness
weight a damping: a buffer of stale updates takes a shorter step (as FedBuff's
``s(tau) / K``), rather than the same step in the stale updates' direction.

Staleness weights (Xie et al., FedAsync, 2019; :func:`staleness_weight`):

- ``constant``: 1;
- ``polynomial``: ``(1 + tau) ** -a``;
- ``hinge``: 1 up to ``tau = b``, then ``1 / (a * (tau - b) + 1)``.

An update staler than ``max_staleness`` is refused (``too-stale``); one whose id was taken
already is a ``duplicate``; one claiming a version not yet made is ``bad-version``. So every
update is counted in exactly one aggregation, or refused with a reason.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from aggregator.heterogeneity import Heterogeneity, PairMoments, adaptive_weight
from edge_client.wire.constants import STALENESS_RULES
from edge_client.wire.run_config import RunSettings
from edge_client.wire.settings_groups import AggregationSettings, AsyncSettings

__all__ = [
    "WEIGHTINGS",
    "Aggregation",
    "Contribution",
    "UpdateBuffer",
    "staleness_weight",
]

Delta = dict[str, npt.NDArray[np.float64]]
#: How buffered updates weigh against each other: the run's ``aggregation``, as it applies.
WEIGHTINGS = ("adaptive", "fedavg", "fednova")


def staleness_weight(staleness: int, rule: str, a: float = 0.5, b: int = 4) -> float:
    """The weight of an update ``staleness`` versions old.

    Parameters
    ----------
    staleness : int
        Versions applied since the one the update was trained from (>= 0).
    rule : {"constant", "polynomial", "hinge"}
        See the module notes.
    a : float
        The exponent (polynomial) or slope (hinge), > 0.
    b : int
        The hinge: staleness up to ``b`` has weight 1.

    Raises
    ------
    ValueError
        If the rule is unknown, the staleness negative, or ``a`` not > 0.
    """
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if not (math.isfinite(a) and a > 0):
        raise ValueError(f"the staleness exponent must be > 0, got {a}")
    if rule == "constant":
        return 1.0
    if rule == "polynomial":
        return float((1 + staleness) ** -a)
    if rule == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"staleness rule must be one of {STALENESS_RULES}, got {rule!r}")


@dataclass(frozen=True)
class Contribution:
    """One update taken into an aggregation."""

    update_id: str
    device: str
    base_version: int
    staleness: int
    weight: float  # the staleness weight s(tau)
    num_examples: int
    local_steps: int = 1


@dataclass
class Aggregation:
    """What one application of the buffer did: the version it made and what went in."""

    version: int
    contributions: list[Contribution] = field(default_factory=list)
    ratio: float | None = None  # adaptive: the r its updates were weighed by

    @property
    def devices(self) -> list[str]:
        """The devices that contributed, in arrival order."""
        return [c.device for c in self.contributions]


class UpdateBuffer:
    """FedBuff's server-side buffer of ``size`` updates (see the module notes).

    Parameters
    ----------
    shapes : mapping of str to tuple of int
        The model's tensors.
    size : int
        Updates per aggregation (K), >= 1.
    rule, a, b : see :func:`staleness_weight`
    weighting : {"adaptive", "fedavg", "fednova"}
        How updates weigh against each other (see the module notes).
    server_lr : float
        The step applied to the buffered mean, > 0.
    max_staleness : int
        Updates staler than this are refused, >= 0.
    version : int
        The model version to start from (a resumed run continues its own).
    heterogeneity : Heterogeneity, optional
        ``adaptive``: the run's estimate (a fresh one if None).
    """

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        size: int,
        rule: str = "polynomial",
        a: float = 0.5,
        b: int = 4,
        weighting: str = "fedavg",
        server_lr: float = 1.0,
        max_staleness: int = 100,
        version: int = 0,
        heterogeneity: Heterogeneity | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"async-buffer must be >= 1, got {size}")
        if not (math.isfinite(server_lr) and server_lr > 0):
            raise ValueError(f"server-lr must be > 0, got {server_lr}")
        if max_staleness < 0:
            raise ValueError(f"max-staleness must be >= 0, got {max_staleness}")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        staleness_weight(0, rule, a, b)  # validates the rule
        self.shapes = dict(shapes)
        self.weighting = weighting
        self.size = size
        self.rule, self.a, self.b = rule, a, b
        self.server_lr = server_lr
        self.max_staleness = max_staleness
        self.version = version
        self._sum = {k: np.zeros(s, np.float64) for k, s in self.shapes.items()}
        self._total = 0.0  # sum of the updates' weights u_i
        self._pending: list[Contribution] = []
        self.heterogeneity = heterogeneity or Heterogeneity()
        self.ratio = self.heterogeneity.ratio()  # adaptive: r of the version being built
        self._pairs = PairMoments(self.shapes)
        # Ids taken in the last max_staleness + 1 versions: older ones are refused anyway.
        self._recent: deque[set[str]] = deque([set()], maxlen=max_staleness + 1)

    @classmethod
    def from_settings(
        cls,
        settings: AsyncSettings | RunSettings,
        shapes: Mapping[str, tuple[int, ...]],
        size: int,
        version: int = 0,
        aggregation: AggregationSettings | None = None,
        heterogeneity: Heterogeneity | None = None,
    ) -> UpdateBuffer:
        """The buffer the run's asynchrony group asks for, ``size`` updates per aggregation,
        from model ``version``, its updates weighed as ``aggregation`` says (adaptive, by
        ``heterogeneity``, or fednova, else fedavg; the run's settings serve too, both groups
        taken from them)."""
        if isinstance(settings, RunSettings):
            aggregation = settings.aggregation_rule
            settings = settings.asynchrony
        rule = aggregation.aggregation if aggregation is not None else "fedavg"
        return cls(
            shapes,
            size,
            rule=settings.staleness,
            a=settings.staleness_exponent,
            b=settings.staleness_hinge,
            weighting=rule if rule in WEIGHTINGS else "fedavg",
            server_lr=settings.server_lr,
            max_staleness=settings.max_staleness,
            version=version,
            heterogeneity=heterogeneity,
        )

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        """Whether ``size`` updates are buffered: time to :meth:`apply`."""
        return len(self._pending) >= self.size

    def add(
        self,
        update_id: str,
        device: str,
        base_version: int,
        delta: Mapping[str, np.ndarray],
        num_examples: int,
        local_steps: int = 1,
        boost: float = 1.0,
    ) -> str | None:
        """Buffer one update; return why it was refused, or None (``boost`` multiplies its
        weight: a drifting device's, :mod:`aggregator.drift_reaction`).

        Returns
        -------
        str or None
            ``too-stale``, ``duplicate`` or ``bad-version`` when refused.

        Raises
        ------
        ValueError
            If ``num_examples`` is not > 0 or the delta's tensors are not the model's.
        """
        if num_examples <= 0:
            raise ValueError(f"an update needs samples, got {num_examples}")
        if base_version > self.version or base_version < 0:
            return "bad-version"
        if any(update_id in ids for ids in self._recent):
            return "duplicate"
        staleness = self.version - base_version
        if staleness > self.max_staleness:
            return "too-stale"
        if set(delta) != set(self.shapes) or any(
            np.shape(delta[k]) != s for k, s in self.shapes.items()
        ):
            raise ValueError("the update's tensors are not the model's")
        weight = staleness_weight(staleness, self.rule, self.a, self.b)
        steps = max(1, local_steps)
        # fedavg: u = samples, the update as it is; fednova: u = 1, the update per step;
        # adaptive: u = n / (n + r), the update per step.
        if self.weighting == "fedavg":
            u, scale = float(num_examples), 1.0
        else:
            u, scale = 1.0, 1.0 / steps
            if self.weighting == "adaptive":
                u = adaptive_weight(num_examples, self.ratio)
                self._pairs.add(delta, num_examples, steps)
        u *= boost
        for k, total in self._sum.items():
            total += (u * weight * scale) * np.asarray(delta[k], np.float64)
        self._total += u
        self._recent[-1].add(update_id)
        self._pending.append(
            Contribution(update_id, device, base_version, staleness, weight, num_examples, steps)
        )
        return None

    def apply(self, arrays: Mapping[str, np.ndarray]) -> tuple[Delta, Aggregation]:
        """Apply the buffered updates to the model ``arrays``; start the next version.

        Returns
        -------
        arrays : dict
            The new model (float64; cast as needed).
        aggregation : Aggregation
            The version made and the updates in it.

        Raises
        ------
        ValueError
            If nothing is buffered.
        """
        if not self._pending:
            raise ValueError("no update is buffered")
        step = self.server_lr / self._total
        if self.weighting != "fedavg":  # per-step updates: scaled back by the mean steps
            step *= sum(c.local_steps for c in self._pending) / len(self._pending)
        new = {k: np.asarray(arrays[k], np.float64) + step * self._sum[k] for k in self.shapes}
        self.version += 1
        made = Aggregation(
            self.version, self._pending, self.ratio if self.weighting == "adaptive" else None
        )
        self._pending = []
        self._total = 0.0
        for total in self._sum.values():
            total.fill(0.0)
        self._recent.append(set())
        if self.weighting == "adaptive":  # the next version weighs by what this one showed
            self.heterogeneity.observe(self._pairs)
            self._pairs = PairMoments(self.shapes)
            self.ratio = self.heterogeneity.ratio()
        return new, made

    def state_dict(self) -> dict[str, Any]:
        """The version and the ids still remembered (for a checkpoint after :meth:`apply`;
        updates buffered and not applied are not kept: their devices train again)."""
        return {"version": self.version, "recent": [sorted(ids) for ids in self._recent]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (the buffer starts empty)."""
        self.version = int(state["version"])
        self._recent = deque(
            [set(ids) for ids in state["recent"]] or [set()], maxlen=self.max_staleness + 1
        )
