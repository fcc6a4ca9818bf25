"""A user's task module, as a user writes one, for the tests that plug tasks in by import
path (``model = "tests.tasks:TinyNet"``, ``task = "tests.tasks:TinyTask"``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from edge_client.task.interface import Classification, Task


class TinyNet(nn.Module):
    """A user's own model: one hidden layer over the flattened sample."""

    def __init__(self, shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(shape), 24), nn.Tanh(), nn.Linear(24, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


class TinyTask(Task):
    """A user's whole task, written against the interface alone (not Classification)."""

    metric = "accuracy"

    def build_model(self, shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        return TinyNet(shape, num_outputs)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets)

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) == targets).float()


class SampleLog(Classification):
    """Classification that logs which samples it sees, by the id written in each sample's
    first value: ``("eval", ids)`` when scoring (no gradients), ``("train", ids)`` when a
    round's training batch is made."""

    def __init__(self) -> None:
        super().__init__("mlp")
        self.events: list[tuple[str, list[int]]] = []

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        phase = "train" if torch.is_grad_enabled() else "eval"
        ids = x.reshape(len(x), -1)[:, 0].round().long().tolist()
        self.events.append((phase, ids))
        return x, y


NOT_A_TASK = 42
