"""Checkpoints: the global model, controller state, round and device map after each round."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

__all__ = [
    "RUN_CONFIG",
    "RUN_ID",
    "SERVER_ROUND",
    "Checkpoint",
    "load_checkpoint",
    "read_state",
    "save_checkpoint",
]

STATE_FILE = "state.json"
#: Key of the run config a checkpoint was made with (``fedstream resume`` submits it again).
RUN_CONFIG = "run-config"
#: Key of the Flower run that wrote the checkpoint (``fedstream resume`` waits for it to end).
RUN_ID = "run-id"
#: Key of the last round the checkpoint holds.
SERVER_ROUND = "server-round"


@dataclass
class Checkpoint:
    """What a resumed aggregator needs."""

    server_round: int
    arrays: ArrayRecord
    controller: dict[str, Any]
    extra: dict[str, Any]


def save_checkpoint(directory: str | Path, ckpt: Checkpoint) -> None:
    """Write the round's model file, then switch ``state.json`` to it with one rename.

    A crash at any point leaves the previous checkpoint whole: ``state.json`` names the
    model file it goes with, and the previous model file is removed only afterwards.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    model_name = f"model-{ckpt.server_round}.pt"
    tmp_model = d / f".{model_name}.tmp"
    torch.save(ckpt.arrays.to_torch_state_dict(), tmp_model)
    os.replace(tmp_model, d / model_name)
    state = {
        SERVER_ROUND: ckpt.server_round,
        "model": model_name,
        "controller": ckpt.controller,
        **ckpt.extra,
    }
    tmp_state = d / f".{STATE_FILE}.tmp"
    tmp_state.write_text(json.dumps(state))
    os.replace(tmp_state, d / STATE_FILE)
    for old in d.glob("model-*.pt"):
        if old.name != model_name:
            old.unlink(missing_ok=True)


def read_state(directory: str | Path) -> dict[str, Any] | None:
    """The checkpoint's ``state.json`` (round, model file, controller, run config, ...)
    without loading the model; None when there is no checkpoint."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def load_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, or None when there is none."""
    state = read_state(directory)
    if state is None:
        return None
    weights = torch.load(Path(directory) / state.pop("model"), weights_only=True)
    return Checkpoint(
        server_round=int(state.pop(SERVER_ROUND)),
        arrays=ArrayRecord(weights),
        controller=state.pop("controller"),
        extra=state,
    )
