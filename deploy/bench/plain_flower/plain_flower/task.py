"""The model and its local training, written as a Flower user writes ``task.py``.

The model is fedstream's default (``SensorCNN``: two 1-D convolutions over
``(channels, steps)`` windows and a linear head), copied here because the baseline must not
import fedstream.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.optim.sgd import sgd


class Net(nn.Module):
    """1-D CNN over ``(channels, steps)`` windows."""

    def __init__(self, channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(channels, width, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch ``(n, channels, steps)``."""
        return self.head(self.features(x))  # type: ignore[no-any-return]


def local_data(
    seed: int, count: int, shape: tuple[int, ...], classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` samples of ``shape`` and their labels, drawn from a seeded generator: the
    node's "dataset on disk"."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, *shape), dtype=np.float32)
    return x, rng.integers(0, classes, count)


def train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    batch: int,
    lr: float,
    optimizer: str = "torch",
) -> float:
    """``steps`` SGD steps (momentum 0.9) of ``batch`` samples; the mean loss."""
    model.train()
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9) if optimizer == "torch" else None
    buffers: list[torch.Tensor | None] = [None] * len(params)
    losses = []
    for k in range(steps):
        xb, yb = xs[k * batch : (k + 1) * batch], ys[k * batch : (k + 1) * batch]
        for p in params:
            p.grad = None
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()  # type: ignore[no-untyped-call]
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                grads = [p.grad for p in params if p.grad is not None]
                sgd(
                    params,
                    grads,
                    buffers,
                    weight_decay=0.0,
                    momentum=0.9,
                    lr=lr,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                )
        losses.append(float(loss.item()))
    return float(np.mean(losses))


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Share of ``x`` the model labels as ``y``."""
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(1).numpy()
    return float((predicted == y).mean())
