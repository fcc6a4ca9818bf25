"""Where published samples come from: the synthetic task or a file, with label skew."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from edge_client.task.datasets import Dataset
from edge_client.task.synthetic import SensorTask

__all__ = [
    "ArraySource",
    "ChangingSource",
    "SampleSource",
    "SensorChange",
    "SyntheticSource",
    "dataset_source",
    "label_distribution",
    "pick_classes",
]


class SampleSource(Protocol):
    """Anything that yields labelled samples of one shape."""

    shape: tuple[int, ...]

    def next(self, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Return ``n`` samples ``(x, y)``."""
        ...


def label_distribution(
    num_classes: int,
    rng: np.random.Generator,
    labels: Sequence[int] | None = None,
    dirichlet: float | None = None,
) -> npt.NDArray[np.float64]:
    """Class probabilities of one device's stream.

    Parameters
    ----------
    num_classes : int
        Number of classes.
    rng : numpy.random.Generator
        Draws the Dirichlet proportions.
    labels : sequence of int, optional
        Only these classes, equally likely (pathological skew).
    dirichlet : float, optional
        Proportions drawn from ``Dirichlet(alpha)``; small alpha means strong skew.

    Returns
    -------
    ndarray
        Probabilities summing to 1 (uniform when neither option is given).
    """
    if labels is not None and dirichlet is not None:
        raise ValueError("give --labels or --dirichlet, not both")
    if labels is not None:
        if not labels or any(not 0 <= k < num_classes for k in labels):
            raise ValueError(f"labels must be classes in [0, {num_classes}), got {list(labels)}")
        p = np.zeros(num_classes)
        p[list(labels)] = 1.0 / len(set(labels))
        return p
    if dirichlet is not None:
        if not dirichlet > 0:
            raise ValueError(f"dirichlet alpha must be > 0, got {dirichlet}")
        probs: npt.NDArray[np.float64] = rng.dirichlet(np.full(num_classes, dirichlet))
        return probs
    return np.full(num_classes, 1.0 / num_classes)


def pick_classes(
    k: int, num_classes: int, *, index: int | None = None, rng: np.random.Generator | None = None
) -> list[int]:
    """The ``k`` classes of one device under pathological skew.

    With ``index`` (a fleet numbered 0..n-1) devices take classes round-robin, so that a
    fleet covers every class as evenly as it can; otherwise ``rng`` (seeded by the device
    id) draws ``k`` distinct classes.
    """
    if not 1 <= k <= num_classes:
        raise ValueError(f"classes per device must be in 1..{num_classes}, got {k}")
    if index is not None:
        return sorted({(index * k + j) % num_classes for j in range(k)})
    if rng is None:
        raise ValueError("pick_classes needs an index or an rng")
    return sorted(int(c) for c in rng.choice(num_classes, size=k, replace=False))


class SyntheticSource:
    """Samples drawn from :class:`~edge_client.task.synthetic.SensorTask`."""

    def __init__(
        self,
        task: SensorTask,
        rng: np.random.Generator,
        label_probs: npt.NDArray[np.float64] | None = None,
        feature_shift: float = 0.0,
    ) -> None:
        self.task = task
        self.shape: tuple[int, ...] = task.shape
        self.rng = rng
        self.label_probs = label_probs
        self.shift = task.device_shift(rng, feature_shift) if feature_shift else None

    def next(self, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        return self.task.sample(n, self.rng, self.label_probs, self.shift)


@dataclass(frozen=True)
class SensorChange:
    """A change in a device's stream part-way through: after ``after`` samples, every
    value becomes ``value * gain + bias`` (a sensor recalibrated, replaced or knocked)."""

    after: int
    gain: float = 1.0
    bias: float = 0.0


class ChangingSource:
    """A source whose samples change as :class:`SensorChange` says (drift benchmarks)."""

    def __init__(self, base: SampleSource, change: SensorChange) -> None:
        self.base = base
        self.change = change
        self.shape: tuple[int, ...] = base.shape
        self.drawn = 0

    def next(self, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        x, y = self.base.next(n)
        changed = np.arange(self.drawn, self.drawn + n) >= self.change.after
        self.drawn += n
        if changed.any():
            x = x.copy()
            x[changed] = x[changed] * self.change.gain + self.change.bias
        return x.astype(np.float32, copy=False), y


class ArraySource:
    """Samples replayed from arrays, drawn by class so that a label skew can be applied.

    Parameters
    ----------
    x, y : ndarray
        Features ``(n, *shape)`` and labels ``(n,)``.
    rng : numpy.random.Generator
        Picks classes and rows.
    label_probs : ndarray, optional
        Class probabilities; uniform over the file's rows when omitted (plain replay order).
    """

    def __init__(
        self,
        x: npt.NDArray[np.float32],
        y: npt.NDArray[np.int64],
        rng: np.random.Generator,
        label_probs: npt.NDArray[np.float64] | None = None,
    ) -> None:
        if len(x) == 0 or len(x) != len(y):
            raise ValueError(f"need as many labels as samples, got {len(x)} and {len(y)}")
        self.x, self.y, self.rng = x, y, rng
        self.shape = tuple(int(d) for d in x.shape[1:])
        self.label_probs = label_probs
        self._cursor = 0
        self._by_class = {int(k): np.flatnonzero(y == k) for k in np.unique(y)}
        if label_probs is not None:
            missing = [k for k in np.flatnonzero(label_probs) if int(k) not in self._by_class]
            if missing:
                raise ValueError(f"the file has no samples of classes {missing}")

    def next(self, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        if self.label_probs is None:
            idx = (self._cursor + np.arange(n)) % len(self.y)
            self._cursor = int(idx[-1] + 1) if n else self._cursor
        else:
            classes = self.rng.choice(len(self.label_probs), size=n, p=self.label_probs)
            idx = np.array([self.rng.choice(self._by_class[int(k)]) for k in classes], dtype=int)
        return self.x[idx], self.y[idx]


def dataset_source(
    data: Dataset,
    rng: np.random.Generator,
    label_probs: npt.NDArray[np.float64] | None = None,
    feature_shift: float = 0.0,
) -> SampleSource:
    """A device's stream of a built-in dataset.

    Parameters
    ----------
    data : Dataset
        The dataset (:func:`edge_client.task.datasets.load_dataset`).
    rng : numpy.random.Generator
        The device's randomness.
    label_probs : ndarray, optional
        Class mix (uniform when omitted).
    feature_shift : float
        Per-device sensor gain/bias scale (the synthetic task only).

    Returns
    -------
    SampleSource

    Raises
    ------
    ValueError
        On a feature shift for a dataset of recorded samples.
    """
    if data.task is not None:
        return SyntheticSource(data.task, rng, label_probs, feature_shift)
    assert data.train is not None
    if feature_shift:
        raise ValueError("feature shift applies to the synthetic sensor task only")
    probs = (
        label_probs
        if label_probs is not None
        else np.full(data.num_classes, 1.0 / data.num_classes)
    )
    return ArraySource(*data.train, rng, probs)
