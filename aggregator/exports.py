"""Model exports from the aggregator: the global model as a versioned artifact every
``export-every`` rounds (asynchronous mode: model versions) and at the end of a run, in
``export-dir``, the newest ``export-keep`` kept (:mod:`edge_client.wire.artifact`).

A version's number is its round, so a resumed run continues the numbering, and a device
following the directory (``fedstream infer --model DIR``) sees versions only move forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from flwr.app import ArrayRecord
from torch import nn

from aggregator.round_log import RoundRecord
from edge_client.task.interface import Task
from edge_client.task.manifest import scores_entry, task_manifest
from edge_client.wire.artifact import PROGRAMS, ModelVersion, write_version
from edge_client.wire.mapping import kebab
from edge_client.wire.settings_groups import ExportSettings, LearningSettings

__all__ = ["ExportSchedule", "export_model"]

log = logging.getLogger(__name__)


def export_model(
    task: Task,
    settings: ExportSettings,
    learning: LearningSettings,
    model: nn.Module,
    arrays: ArrayRecord,
    record: RoundRecord,
    personal: frozenset[str] = frozenset(),
) -> ModelVersion:
    """Write ``arrays`` (loaded into ``model``, the task's architecture for ``learning``'s
    sample shape) as version ``record.round`` of ``export-dir``, with the round's
    prequential and held-out scores.

    Under personalisation the manifest's ``personal-layers`` names the tensors each device
    keeps: the program holds their initial values, which a device replaces by its own (its
    ``fedstream infer`` serves the model its ClientApp stored, personal layers included).
    Under differential privacy the manifest holds ``dp-epsilon-spent`` as of the version."""
    model.load_state_dict(arrays.to_torch_state_dict())
    predictor = task.predictor(model)
    example = torch.randn(2, *task.input_shape(learning.shape))
    manifest = {
        **task_manifest(task, learning, record.round),
        "source": "aggregator",
        "prequential": scores_entry(task.metric, record.accuracy, record.loss, record.eval_count),
        "eval-data": scores_entry(task.metric, record.test_accuracy, record.test_loss),
        "personal-layers": sorted(personal),
    }
    if record.dp_epsilon_spent is not None:  # what the model's training spent, with it
        manifest[kebab("dp_epsilon_spent")] = record.dp_epsilon_spent
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


class ExportSchedule:
    """When the run exports: every ``export-every`` rounds (asynchronous mode: versions),
    and at its end when the last export is older than the last committed round.

    Parameters
    ----------
    settings : ExportSettings
        ``export-dir`` (none: no exports), ``export-every``, ``export-keep``.
    learning : LearningSettings
        The model's sample shape and the task's names, for the manifest.
    task : Task
        What is learned.
    personal : frozenset of str, optional
        The tensors each device keeps (the manifest's ``personal-layers``).
    """

    def __init__(
        self,
        settings: ExportSettings,
        learning: LearningSettings,
        task: Task,
        personal: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.learning = learning
        self.task = task
        self.personal = personal
        self.exported = 0  # the last version exported

    def after_round(
        self, scratch: Callable[[], nn.Module], arrays: ArrayRecord, record: RoundRecord
    ) -> int:
        """Export ``arrays`` if ``record``'s round is due; return the version (0: none).
        ``scratch`` gives a model of the task's architecture to load them into (asked for
        only when an export is due)."""
        s = self.settings
        if not (s.export_dir and s.export_every and record.round % s.export_every == 0):
            return 0
        return self._export(scratch(), arrays, record)

    def at_end(
        self, scratch: Callable[[], nn.Module], arrays: ArrayRecord, last: RoundRecord | None
    ) -> None:
        """At the end of a run: export the last committed model ``arrays`` (of round
        ``last``) if the last export is older."""
        if last is not None and self.settings.export_dir and self.exported < last.round:
            self._export(scratch(), arrays, last)

    def _export(self, model: nn.Module, arrays: ArrayRecord, record: RoundRecord) -> int:
        version = export_model(
            self.task, self.settings, self.learning, model, arrays, record, self.personal
        )
        self.exported = version.version
        return self.exported
