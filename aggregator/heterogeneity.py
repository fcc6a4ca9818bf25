"""How much the devices' updates differ beyond their sampling noise: the weights of the
``adaptive`` aggregation rule (:class:`aggregator.aggregation.AdaptiveMean`).

With per-device batches (OmniLearn) the devices train on very different numbers of samples
in a round. Two errors pull the choice of weights opposite ways:

* **sampling noise**: a device's update (per local step) is its stream's gradient plus noise
  of variance ``S / n_i`` for ``n_i`` samples. Weighting by samples (``fedavg``) gives the
  least noise; equal weights (``fednova``) let a slow device's few-sample update add
  ``n / n_slow`` times the noise it should, which is what makes the controller's unequal
  batches learn less per round than the equal split on IID streams;
* **heterogeneity**: under label skew each device's stream pulls towards its own classes,
  by ``H`` (the mean squared distance of a device's expected update from the fleet's).
  Weighting by samples then leans to the fast devices' classes (the objective
  inconsistency FedNova corrects); equal weights do not.

When the devices' expected updates scatter by ``H`` around the mean device's and each update
adds its sampling noise, the least-variance estimate of that mean weighs each update by the
inverse of its variance around it, ``1 / (H + S / n_i)``: the weights of a random-effects
meta-analysis (DerSimonian and Laird, 1986), that is ``n_i / (n_i + r)`` with ``r = S / H``
samples. ``r -> inf`` (IID streams, no heterogeneity) gives sample weights, ``r -> 0`` (skew
far above the noise) equal weights, and any ``r`` bounds a device's weight by 1 whatever
its samples: the fast devices weigh at most the same as everyone else.

``H`` and ``S`` are estimated from the updates themselves: for two devices,
``E ||d_i - d_j||^2 = 2 H + S (1/n_i + 1/n_j)`` (``d`` an update per local step), a line in
``x = 1/n_i + 1/n_j`` whose intercept is ``2 H`` and slope ``S``. Each round's pairs
(:class:`PairMoments`: running sums, so that memory stays O(model) whatever the fleet, over
at most :data:`SKETCH` coordinates of the model, so that their cost does too) are
pooled with the earlier rounds' in least-squares sums that decay by :data:`DECAY` a round
(:class:`Heterogeneity`); each round's distances are divided by their running scale first,
since updates shrink as the model converges. Pooling is what lets an asynchronous buffer of
two updates (one pair) count. Until the pooled pairs span two sample counts there is no
slope, and the weights are equal (``r = 0``): the cautious choice under skew, and the only
one where every device trained the same number of samples anyway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["DECAY", "MAX_RATIO", "SKETCH", "Heterogeneity", "PairMoments", "adaptive_weight"]

#: Weight of the earlier rounds' pairs against a new round's in the pooled fit (per round):
#: about the last five rounds count.
DECAY = 0.8
#: ``r`` when the fit sees no heterogeneity: far beyond any round's samples, so that
#: ``n / (n + r)`` is proportional to ``n`` (sample weights), and finite in ``metrics.jsonl``.
MAX_RATIO = 1e9
#: Most coordinates of an update the pair distances are taken over (:class:`PairMoments`):
#: the default CNN's every one; a larger model's fixed random subset of this many.
SKETCH = 8192
_SKETCH_SEED = 0x5EED  # the subset is a function of the model's shapes alone
# Scale of the pair distances: an EWMA over rounds with this weight on the newest.
_SCALE_SMOOTHING = 0.5
# Pooled 1/n values that spread less than this (relative) say nothing about the slope.
_MIN_SPREAD = 1e-6


def adaptive_weight(samples: float, ratio: float) -> float:
    """The ``adaptive`` rule's weight of an update trained on ``samples`` samples, given the
    fleet's noise-to-heterogeneity ratio ``ratio`` (samples): ``n / (n + r)``, 1 (equal
    weights) at ``r = 0`` and proportional to ``n`` (sample weights) for ``r`` far above
    every device's samples."""
    if ratio <= 0:
        return 1.0
    return samples / (samples + ratio)


class PairMoments:
    """The least-squares sums of one round's pairs ``(x_ij, D_ij)``, ``x_ij = 1/n_i + 1/n_j``,
    ``D_ij = ||d_i - d_j||^2``, kept as running sums of the updates (no update is stored).

    With ``T = sum d_i``, ``U = sum d_i / n_i``, ``A = sum ||d_i||^2``, ``QA = sum ||d_i||^2 /
    n_i``, ``Q = sum 1/n_i`` and ``Q2 = sum 1/n_i^2`` over ``k`` updates, the sums over the
    ``k (k - 1) / 2`` pairs are ``sum D = k A - ||T||^2``, ``sum x D = k QA + Q A - 2 <U, T>``,
    ``sum x = (k - 1) Q`` and ``sum x^2 = (k - 2) Q2 + Q^2``.

    A model of more than :data:`SKETCH` values is sketched: the distances are taken over a
    fixed random subset of that many coordinates (the same for every update; drawn from a
    fixed seed, so a run repeats). Every coordinate's squared difference is in the distance
    with the same chance, so the intercept and slope shrink alike and ``r``, their ratio,
    stays what the whole model gives, up to the sketch's sampling noise; the cost per
    update stays that of a few thousand values whatever the model.

    Parameters
    ----------
    shapes : mapping of str to shape
        The tensors an update holds.
    sketch : int
        Most coordinates the distances are taken over.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], sketch: int = SKETCH) -> None:
        sizes = {k: int(np.prod(s)) for k, s in shapes.items()}
        total = sum(sizes.values())
        self._picks: dict[str, np.ndarray | None] = dict.fromkeys(shapes)
        if total > sketch:
            rng = np.random.default_rng(_SKETCH_SEED)
            chosen = np.sort(rng.choice(total, size=sketch, replace=False))
            start = 0
            for k, size in sizes.items():
                inside = chosen[(chosen >= start) & (chosen < start + size)]
                self._picks[k] = inside - start
                start += size
        self._t = {k: np.zeros(self._length(k, sizes[k]), np.float64) for k in shapes}
        self._u = {k: np.zeros_like(t) for k, t in self._t.items()}
        self.count = 0
        self._a = self._qa = self._q = self._q2 = 0.0

    @property
    def coordinates(self) -> int:
        """How many coordinates of an update the distances are taken over."""
        return sum(t.size for t in self._t.values())

    def _length(self, key: str, size: int) -> int:
        picks = self._picks[key]
        return size if picks is None else len(picks)

    def add(self, delta: Mapping[str, np.ndarray], samples: float, steps: int = 1) -> None:
        """Add one update of ``steps`` local steps (divided by them here: a per-step update),
        trained on ``samples`` > 0."""
        q = 1.0 / samples
        norm = 0.0
        for k, d in delta.items():
            picks = self._picks[k]
            flat = np.asarray(d).reshape(-1)
            per_step = (flat if picks is None else flat[picks]).astype(np.float64) / max(1, steps)
            self._t[k] += per_step
            self._u[k] += q * per_step
            norm += float(np.vdot(per_step, per_step))
        self._a += norm
        self._qa += q * norm
        self._q += q
        self._q2 += q * q
        self.count += 1

    def sums(self) -> tuple[float, float, float, float, float] | None:
        """``(pairs, sum x, sum x^2, sum D, sum x D)`` over the round's pairs; None with fewer
        than two updates (no pair)."""
        k = self.count
        if k < 2:
            return None
        tt = sum(float(np.vdot(t, t)) for t in self._t.values())
        ut = sum(float(np.vdot(self._u[n], t)) for n, t in self._t.items())
        return (
            k * (k - 1) / 2,
            (k - 1) * self._q,
            (k - 2) * self._q2 + self._q**2,
            k * self._a - tt,
            k * self._qa + self._q * self._a - 2 * ut,
        )


class Heterogeneity:
    """The fleet's noise-to-heterogeneity ratio ``r = S / H`` (samples), pooled over rounds
    (see the module notes); the ``adaptive`` rule weighs an update ``n / (n + r)``.

    Parameters
    ----------
    decay : float
        Weight of the earlier rounds against the newest, in (0, 1).
    """

    def __init__(self, decay: float = DECAY) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self._sums = np.zeros(5)  # weight, x, x^2, y, x y (y: a distance over the scale)
        self._scale = 0.0  # running scale of the pair distances (0: none yet)
        self.rounds = 0  # rounds that went into the fit

    def fit(self) -> tuple[float, float] | None:
        """``(H, S)`` of the pooled fit, in units of the distances' running scale (None
        before a round with a spread of sample counts)."""
        w, x, xx, y, xy = self._sums
        det = w * xx - x * x
        if self.rounds == 0 or det <= _MIN_SPREAD * w * xx:
            return None
        slope = (w * xy - x * y) / det
        intercept = (y - slope * x) / w
        return intercept / 2, slope

    def ratio(self) -> float:
        """``r = S / H`` in samples: 0 (equal weights) before any estimate or when the fit
        sees no sampling noise, :data:`MAX_RATIO` (sample weights) when it sees no
        heterogeneity."""
        fit = self.fit()
        if fit is None:
            return 0.0
        h, s = fit
        if s <= 0:
            return 0.0
        if h <= s / MAX_RATIO:
            return MAX_RATIO
        return float(s / h)

    def observe(self, moments: PairMoments) -> None:
        """Pool one round's (or one asynchronous aggregation's) updates into the fit."""
        sums = moments.sums()
        if sums is None:
            return
        pairs, x, xx, y, xy = sums
        if not (math.isfinite(y) and math.isfinite(xy) and y > 0):
            return  # identical updates: nothing to learn
        mean_y = y / pairs
        self._scale = (
            mean_y
            if self._scale == 0
            else (1 - _SCALE_SMOOTHING) * self._scale + _SCALE_SMOOTHING * mean_y
        )
        self._sums = self.decay * self._sums + np.array(
            [pairs, x, xx, y / self._scale, xy / self._scale]
        )
        self.rounds += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"sums": self._sums.tolist(), "scale": self._scale, "rounds": self.rounds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (an empty mapping: a fresh estimate)."""
        if not state:
            return
        sums = np.asarray(state["sums"], dtype=float)
        if sums.shape != (5,) or not np.all(np.isfinite(sums)):
            raise ValueError(f"heterogeneity state must hold 5 finite sums, got {state['sums']}")
        self._sums = sums
        self._scale = float(state["scale"])
        self.rounds = int(state["rounds"])
