"""How a model is scored: accuracy and mean cross-entropy on labelled samples."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["evaluate", "per_class_accuracy"]


@torch.no_grad()
def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device | None = None
) -> tuple[float, float]:
    """Return (accuracy, mean loss) of ``model`` on ``(x, y)``."""
    device = device or torch.device("cpu")
    model.to(device).eval()
    logits = model(torch.from_numpy(x).to(device))
    target = torch.from_numpy(y).to(device)
    loss = nn.functional.cross_entropy(logits, target).item()
    acc = (logits.argmax(1) == target).float().mean().item()
    return float(acc), float(loss)


@torch.no_grad()
def per_class_accuracy(
    model: nn.Module, x: np.ndarray, y: np.ndarray, num_classes: int
) -> list[float | None]:
    """Accuracy of ``model`` on the samples of each class (None for a class with none)."""
    model.eval()
    predicted = model(torch.from_numpy(x)).argmax(1).numpy()
    return [
        float(np.mean(predicted[y == c] == c)) if np.any(y == c) else None
        for c in range(num_classes)
    ]
