"""Server-side evaluation, where the aggregator really has data: ``eval-data``.

The devices evaluate every round prequentially (the received model on the samples they then
train on); that needs no data on the aggregator and is what a round's ``accuracy`` reports.
When the run names ``eval-data`` (a built-in dataset's held-out set, or a user's
``.npz``/``.csv`` test file on the aggregator's host) the aggregator also scores each new
global model on it: ``test-accuracy``. With ``eval-group-by`` (a key the file holds, e.g. the
subject) it scores each group apart too: ``test-by-group``, the model's score on each person
it never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from torch import nn

from edge_client.task.datasets import load_dataset
from edge_client.task.interface import Scores, Task, evaluate
from edge_client.task.recordings import load_groups, load_recording
from edge_client.wire.constants import DATASETS
from edge_client.wire.settings_groups import EvaluationSettings, LearningSettings

__all__ = ["ServerEvaluation"]


@dataclass(frozen=True)
class ServerEvaluation:
    """The aggregator's held-out samples, ready to score a model on.

    With a task that preprocesses, the samples are preprocessed once with statistics of
    their own (each device standardises by its own stream's; the aggregator has no stream):
    with groups (``eval-group-by``), each group's by its own, as that person's or machine's
    device would.
    """

    task: Task
    x: np.ndarray
    y: np.ndarray
    groups: npt.NDArray[np.str_] | None = None  # each sample's group (eval-group-by)

    @classmethod
    def from_settings(
        cls,
        settings: EvaluationSettings,
        learning: LearningSettings,
        seed: int,
        task: Task,
    ) -> ServerEvaluation | None:
        """The run's ``eval-data``, at most ``eval-samples`` of it (drawn by ``seed`` from a
        larger file), for a model of ``learning``'s ``sample-shape`` and ``num-classes``;
        None without.

        Raises
        ------
        ValueError
            If the file cannot be read, or its samples are not of the run's
            ``sample-shape`` or have labels beyond ``num-classes``, or ``eval-group-by``
            names a key the file does not hold (or goes with a built-in dataset).
        """
        source, key = settings.eval_data, settings.eval_group_by
        if not source:
            if key:
                raise ValueError("eval-group-by scores eval-data by group: give eval-data")
            return None
        shape, classes = learning.shape, learning.num_classes
        groups = None
        if source in DATASETS:
            if key:
                raise ValueError(f"eval-group-by needs a recording as eval-data, not {source!r}")
            data = load_dataset(source, shape, classes)
            x, y = data.eval_set(settings.eval_samples, seed)
        else:
            x, y = load_recording(source, shape, group_key=key or None)
            groups = load_groups(source, key) if key else None
            if len(y) > settings.eval_samples:  # a sample of it, not its first rows (sorted?)
                keep = np.random.default_rng(seed).permutation(len(y))[: settings.eval_samples]
                x, y = x[keep], y[keep]
                groups = None if groups is None else groups[keep]
        if tuple(x.shape[1:]) != shape:
            raise ValueError(
                f"eval-data {source}: samples of shape {tuple(x.shape[1:])}, the run's "
                f"sample-shape is {shape}"
            )
        if int(y.max()) >= classes:
            raise ValueError(
                f"eval-data {source}: labels up to {int(y.max())}, the run has num-classes "
                f"{classes}"
            )
        return cls(task, _preprocessed(task, x, groups), y, groups)

    def __call__(self, model: nn.Module) -> Scores:
        """``model``'s scores on the held-out samples."""
        return evaluate(self.task, model, self.x, self.y)

    def by_group(self, scores: Scores) -> dict[str, float]:
        """Each group's score (the mean of its samples' metric) in ``scores`` of these
        samples; empty without groups."""
        if self.groups is None or scores.values is None:
            return {}
        return {
            str(g): float(np.mean(scores.values[self.groups == g]))
            for g in sorted(set(self.groups.tolist()))
        }


def _preprocessed(task: Task, x: np.ndarray, groups: npt.NDArray[np.str_] | None) -> np.ndarray:
    """``x`` through the task's preprocessing, fitted on each group apart (on all of ``x``
    without groups); ``x`` itself when the task has none."""
    if task.preprocessor() is None:
        return x
    out = np.empty_like(x)
    parts = [np.ones(len(x), bool)] if groups is None else [groups == g for g in set(groups)]
    for part in parts:
        preprocessor = task.preprocessor()
        assert preprocessor is not None
        preprocessor.update(x[part])
        out[part] = preprocessor(x[part])
    return out
