"""The device's own model directory: each global model its ClientApp receives, kept as a
versioned export (:mod:`edge_client.wire.artifact`) for ``fedstream infer``.

Training already brings every new global model to the device, so inference needs no second
distribution channel: with ``model-dir`` in its node config, the ClientApp writes the model
it received (version = the round it was made after), with its own prequential scores of it
on the samples it then trained on. The program is exported once per architecture (about 4 s
the first time: ``torch.export`` loads its compiler) and hard-linked into each version;
after that a round writes only the weights. The last :data:`KEEP` versions are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from edge_client.task.interface import Scores, Task
from edge_client.task.manifest import scores_entry, task_manifest
from edge_client.wire.artifact import PROGRAMS, ModelVersion, write_version
from edge_client.wire.run_config import RunSettings

__all__ = ["KEEP", "store_model"]

log = logging.getLogger(__name__)

#: Versions a device keeps.
KEEP = 3


def store_model(
    model_dir: str | Path,
    task: Task,
    settings: RunSettings,
    weights: Mapping[str, np.ndarray],
    version: int,
    device_id: str,
    scores: Scores | None,
) -> ModelVersion | None:
    """Keep ``weights`` (the global model as received) as version ``version``.

    Never fails the round: a model that cannot be written is logged and skipped (the
    device trains as before; inference keeps its previous version).
    """
    try:
        model = task.build_model(settings.shape, settings.num_classes)
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
        manifest = {
            **task_manifest(task, settings, version),
            "source": f"device {device_id}",
        }
        if scores is not None:
            manifest["prequential"] = scores_entry(
                task.metric, scores.metric, scores.loss, scores.count
            )
        return write_version(
            model_dir,
            version,
            task.predictor(model),
            torch.randn(2, *task.input_shape(settings.shape)),
            manifest,
            keep=KEEP,
            program_cache=Path(model_dir) / PROGRAMS,
        )
    except Exception as err:
        log.warning(
            "device %s: could not keep model version %d in %s: %s",
            device_id,
            version,
            model_dir,
            err,
        )
        return None
