"""Checkpoints: the global model, controller state, round and device map after each round."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord

__all__ = ["Checkpoint", "load_checkpoint", "save_checkpoint"]

MODEL_FILE = "model.pt"
STATE_FILE = "state.json"


@dataclass
class Checkpoint:
    """What a resumed aggregator needs."""

    server_round: int
    arrays: ArrayRecord
    controller: dict[str, Any]
    extra: dict[str, Any]


def save_checkpoint(directory: str | Path, ckpt: Checkpoint) -> None:
    """Write atomically (temporary files, then rename): a crash leaves the previous one."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp_model = d / f".{MODEL_FILE}.tmp"
    torch.save(ckpt.arrays.to_torch_state_dict(), tmp_model)
    tmp_state = d / f".{STATE_FILE}.tmp"
    state = {"server-round": ckpt.server_round, "controller": ckpt.controller, **ckpt.extra}
    tmp_state.write_text(json.dumps(state))
    os.replace(tmp_model, d / MODEL_FILE)
    os.replace(tmp_state, d / STATE_FILE)


def load_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, or None when there is none."""
    d = Path(directory)
    if not (d / STATE_FILE).exists():
        return None
    state = json.loads((d / STATE_FILE).read_text())
    weights = torch.load(d / MODEL_FILE, weights_only=True)
    return Checkpoint(
        server_round=int(state.pop("server-round")),
        arrays=ArrayRecord(weights),
        controller=state.pop("controller"),
        extra=state,
    )
