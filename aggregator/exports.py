"""Model exports from the aggregator: the global model as a versioned artifact every
``export-every`` rounds (asynchronous mode: model versions) and at the end of a run, in
``export-dir``, the newest ``export-keep`` kept (:mod:`edge_client.wire.artifact`).

A version's number is its round, so a resumed run continues the numbering, and a device
following the directory (``fedstream infer --model DIR``) sees versions only move forward.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from flwr.app import ArrayRecord
from torch import nn

from aggregator.round_log import RoundRecord
from edge_client.task.interface import Task
from edge_client.task.manifest import scores_entry, task_manifest
from edge_client.wire.artifact import PROGRAMS, ModelVersion, write_version
from edge_client.wire.run_config import RunSettings

__all__ = ["export_model"]

log = logging.getLogger(__name__)


def export_model(
    task: Task,
    settings: RunSettings,
    model: nn.Module,
    arrays: ArrayRecord,
    record: RoundRecord,
) -> ModelVersion:
    """Write ``arrays`` (loaded into ``model``, the task's architecture) as version
    ``record.round`` of ``export-dir``, with the round's prequential and held-out scores."""
    model.load_state_dict(arrays.to_torch_state_dict())
    predictor = task.predictor(model)
    example = torch.randn(2, *task.input_shape(settings.shape))
    manifest = {
        **task_manifest(task, settings, record.round),
        "source": "aggregator",
        "prequential": scores_entry(task.metric, record.accuracy, record.loss, record.eval_count),
        "eval-data": scores_entry(task.metric, record.test_accuracy, record.test_loss),
    }
    version = write_version(
        settings.export_dir,
        record.round,
        predictor,
        example,
        manifest,
        settings.export_keep,
        program_cache=Path(settings.export_dir) / PROGRAMS,
    )
    log.info(
        "exported version %d to %s (%s, %.1f s)",
        version.version,
        version.path,
        version.manifest["program-format"],
        version.manifest["export-s"],
    )
    return version
