"""A synthetic multi-subject activity recording, laid out as a real one is.

Public activity recordings (UCI HAR, WISDM, PAMAP2) are made subject by subject: each
person follows a protocol of activities (standing, sitting, lying, walking, stairs) in
blocks of seconds to minutes, so a person's windows arrive one activity after another,
never shuffled, and each person's sensor sits a little differently (gain and bias per
channel). UCI HAR's training part has 21 subjects of 281-409 windows each, in blocks of 7-48
windows of one activity, every activity twice; its test part 9 other subjects.

:func:`people_recording` draws such a recording from the default task
(:class:`~edge_client.task.synthetic.SensorTask`): per subject a feature shift
(:meth:`~edge_client.task.synthetic.SensorTask.device_shift`), a size and blocks like UCI
HAR's, the subjects one after another, and the array ``subject`` saying whose each window
is. It is what tests and benchmarks partition by subject when no real recording is at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_client.task.constants import DEFAULT_SHAPE
from edge_client.task.synthetic import SensorTask

__all__ = ["PEOPLE_KEY", "People", "people_recording"]

#: The array naming each window's subject.
PEOPLE_KEY = "subject"
_ACTIVITIES = 6
_WINDOWS = (281, 409)  # a subject's windows (uniform), as in UCI HAR's training part
_PASSES = 2  # the protocol runs twice: every activity in two blocks


@dataclass(frozen=True)
class People:
    """A multi-subject recording in recorded order.

    Attributes
    ----------
    x : ndarray, float32, ``(n, channels, steps)``
    y : ndarray, int64, ``(n,)``
        Activity labels.
    subject : ndarray, int64, ``(n,)``
        Whose each window is; each subject's windows are contiguous.
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    subject: npt.NDArray[np.int64]

    def where(self, subjects: npt.ArrayLike) -> People:
        """The windows of ``subjects`` only, still in recorded order."""
        keep = np.isin(self.subject, np.asarray(subjects))
        return People(self.x[keep], self.y[keep], self.subject[keep])

    def save(self, path: str | Path) -> Path:
        """Write an ``.npz`` with ``x``, ``y`` and ``subject``, as ``--source`` and
        ``--test`` read it (``--partition-by subject``)."""
        path = Path(path)
        arrays = {"x": self.x, "y": self.y, PEOPLE_KEY: self.subject}
        np.savez(path, **arrays)  # type: ignore[arg-type]
        return path


def people_recording(
    subjects: int,
    seed: int = 0,
    shift: float = 1.0,
    shape: tuple[int, int] = DEFAULT_SHAPE,
    noise: float = 1.5,
) -> People:
    """Draw ``subjects`` people's windows, numbered from 1, one person after another.

    Parameters
    ----------
    subjects : int
        How many people.
    seed : int
        Seeds every draw (sizes, protocols, shifts, windows).
    shift : float
        Magnitude of each person's feature shift (0: everyone's sensor alike).
    shape : (int, int)
        Channels and steps of a window.
    noise : float
        The task's noise (its signals' amplitudes are about 1).

    Returns
    -------
    People
    """
    if subjects < 1:
        raise ValueError(f"need at least one subject, got {subjects}")
    task = SensorTask(shape, _ACTIVITIES, noise=noise)
    rng = np.random.default_rng(seed)
    xs, ys, whose = [], [], []
    for person in range(1, subjects + 1):
        labels = _protocol(rng, int(rng.integers(_WINDOWS[0], _WINDOWS[1] + 1)))
        person_shift = task.device_shift(rng, shift) if shift else None
        xs.append(_conditioned(task, labels, rng, person_shift))
        ys.append(labels)
        whose.append(np.full(len(labels), person, np.int64))
    return People(np.concatenate(xs), np.concatenate(ys), np.concatenate(whose))


def _protocol(rng: np.random.Generator, windows: int) -> npt.NDArray[np.int64]:
    """A person's activity labels in recorded order: every activity in ``_PASSES`` blocks,
    each pass in its own order, the blocks' lengths shared out unevenly."""
    order = np.concatenate([rng.permutation(_ACTIVITIES) for _ in range(_PASSES)])
    weights = rng.uniform(7.0, 48.0, len(order))
    lengths = np.maximum(1, np.round(weights / weights.sum() * windows)).astype(int)
    return np.repeat(order, lengths).astype(np.int64)


def _conditioned(
    task: SensorTask,
    labels: npt.NDArray[np.int64],
    rng: np.random.Generator,
    shift: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None,
) -> npt.NDArray[np.float32]:
    """Windows of the given activities (one-hot class probabilities, one block at a time)."""
    x = np.empty((len(labels), *task.shape), np.float32)
    starts = np.flatnonzero(np.diff(labels, prepend=-1))
    ends = np.append(starts[1:], len(labels))
    for start, end in zip(starts, ends, strict=True):
        probs = np.eye(task.num_classes)[labels[start]]
        x[start:end], _ = task.sample(int(end - start), rng, label_probs=probs, shift=shift)
    return x
