"""What an export's manifest says of the run's task (written by the aggregator's exports and
the device's model store alike, so the two agree)."""

from __future__ import annotations

import math
from typing import Any

from edge_client.task.interface import Task
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings
from edge_client.wire.settings_groups import LearningSettings

__all__ = ["SAMPLE_SHAPE", "scores_entry", "task_manifest"]

#: The manifest's key of the sample shape: the run config's own key.
SAMPLE_SHAPE = kebab("sample_shape")


def task_manifest(
    task: Task, settings: LearningSettings | RunSettings, version: int
) -> dict[str, Any]:
    """The task's part of a manifest (kebab-case keys): what the model takes and returns,
    and the metric it is scored by; ``settings``: the run's learning group (or the run's
    settings, whose keys read flat).

    ``version`` is the round after which the model was made (asynchronous mode: its
    version).
    """
    return {
        "task": repr(task),
        "task-name": settings.task,
        "output": task.output,
        "metric": task.metric,
        "higher-is-better": task.higher_is_better,
        SAMPLE_SHAPE: list(settings.shape),
        "num-classes": settings.num_classes if task.output == "probabilities" else 0,
        "round": version,
        **task.describe(),
    }


def scores_entry(
    metric: str, value: float, loss: float, samples: int | None = None
) -> dict[str, Any]:
    """A manifest's scores (``prequential``, ``eval-data``): NaN written as null."""
    entry: dict[str, Any] = {
        metric: value if math.isfinite(value) else None,
        "loss": loss if math.isfinite(loss) else None,
    }
    if samples is not None:
        entry["samples"] = samples
    return entry
