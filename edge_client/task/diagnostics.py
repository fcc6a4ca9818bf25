"""Classification diagnostics beyond the task's metric: accuracy per class.

(A task's own metric and loss: :func:`edge_client.task.interface.evaluate`.)"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["per_class_accuracy"]


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
