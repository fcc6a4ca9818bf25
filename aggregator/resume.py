"""Resuming a run: the checkpoint a run starts from (refused when it holds a model for
another configuration), and what a round's checkpoint keeps beyond the model so that a
resumed run goes on where the last one stopped (:mod:`aggregator.checkpoint` holds the
format)."""

from __future__ import annotations

import logging
from typing import Any

from flwr.app import ArrayRecord

from aggregator.checkpoint import RUN_CONFIG, Checkpoint, load_checkpoint, save_checkpoint
from edge_client.wire.knob_checks import parse_shape
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import upgrade_saved
from edge_client.wire.settings_groups import CheckpointSettings, LearningSettings

__all__ = [
    "DIVERGED_ROUNDS",
    "DRIFT",
    "HETEROGENEITY",
    "MODEL_SETTINGS",
    "PRIVACY",
    "SKIPPED",
    "check_resumable",
    "load_resume",
    "save_round",
]

log = logging.getLogger(__name__)

#: Settings a checkpoint's model depends on: a resume must not change them.
MODEL_SETTINGS = ("task", "model", "model_width", "sample_shape", "num_classes")
#: Keys of the skipped rounds per reason, the drift reaction's state, and the rounds in a
#: row in which training diverged, in a checkpoint.
SKIPPED = "skipped-rounds"
DRIFT = "drift"
DIVERGED_ROUNDS = "diverged-rounds"
PRIVACY = "privacy"  # the accountant's rounds and the clip (aggregator.privacy)
HETEROGENEITY = "heterogeneity"  # the adaptive rule's pooled fit (aggregator.heterogeneity)


def load_resume(settings: CheckpointSettings, learning: LearningSettings) -> Checkpoint | None:
    """The checkpoint the run resumes from: ``checkpoint-dir``'s when ``resume`` is set and
    it holds one, else None (a fresh start).

    Raises
    ------
    ValueError
        If it holds a model for another task, model, sample shape or class count.
    """
    if not (settings.checkpoint_dir and settings.resume):
        return None
    ckpt = load_checkpoint(settings.checkpoint_dir)
    if ckpt is not None:
        check_resumable(ckpt, learning, settings.checkpoint_dir)
        log.info("resuming after round %d from %s", ckpt.server_round, settings.checkpoint_dir)
    return ckpt


def save_round(
    directory: str,
    server_round: int,
    arrays: ArrayRecord,
    controller: dict[str, Any],
    fleet: dict[str, Any],
    run_config: dict[str, Any],
    state: dict[str, Any],
) -> None:
    """Checkpoint the model ``arrays`` as of ``server_round``, with the controller's and the
    fleet's state, the run config (what ``fedstream resume`` submits again) and ``state``:
    the rest a resume needs (the skipped and diverged rounds, the drift reaction's state,
    an asynchronous run's buffer)."""
    extra = {**fleet, RUN_CONFIG: run_config, **state}
    save_checkpoint(directory, Checkpoint(server_round, arrays, controller, extra))


def check_resumable(ckpt: Checkpoint, learning: LearningSettings, directory: str) -> None:
    """Refuse a checkpoint made for another model (its arrays would not fit).

    Raises
    ------
    ValueError
        If the checkpoint's run config names another task, model, sample shape or class
        count.
    """
    saved = upgrade_saved(ckpt.extra.get(RUN_CONFIG, {}))

    def same(name: str) -> bool:
        old, new = saved[kebab(name)], getattr(learning, name)
        if name == "sample_shape":  # "6,32" and "6x32" are one shape
            return parse_shape(str(old)) == learning.shape
        return bool(old == new)

    changed = [
        f"{kebab(name)}: {saved[kebab(name)]!r} -> {getattr(learning, name)!r}"
        for name in MODEL_SETTINGS
        if kebab(name) in saved and not same(name)
    ]
    if changed:
        raise ValueError(
            f"cannot resume from {directory}: it holds a model for another "
            f"configuration ({'; '.join(changed)}); use a new checkpoint-dir or resume=false"
        )
