"""Model zoo: small networks for multi-channel sensor windows (fit on a Raspberry Pi)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from edge_client.task.constants import MODELS

__all__ = ["MODELS", "SensorCNN", "SensorMLP", "build_model"]


class SensorCNN(nn.Module):
    """1D-CNN over ``(channels, steps)`` windows: two conv layers, global average pool.

    About 6k parameters for 6x32 windows and 6 classes.
    """

    def __init__(
        self, channels: int, num_classes: int, width: int = 32, norm: bool = False
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for inputs in (channels, width):
            layers.append(nn.Conv1d(inputs, width, kernel_size=5, padding=2))
            if norm:  # cnn-bn: batch normalisation after each convolution (FedBN's layers)
                layers.append(nn.BatchNorm1d(width))
            layers.append(nn.ReLU())
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch ``(n, channels, steps)``."""
        return self.head(self.features(x))  # type: ignore[no-any-return]


class SensorMLP(nn.Module):
    """Two-layer perceptron over flattened windows."""

    def __init__(self, inputs: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(inputs, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch ``(n, *shape)``."""
        return self.net(x)  # type: ignore[no-any-return]


def build_model(
    name: str, shape: Sequence[int], num_classes: int, seed: int | None = 0, width: int = 0
) -> nn.Module:
    """A freshly initialised model (deterministic for a seed).

    Parameters
    ----------
    name : {"cnn", "cnn-bn", "mlp"}
        Architecture (``cnn-bn``: the CNN with batch normalisation after each convolution).
    shape : sequence of int
        Per-sample shape; the CNN needs ``(channels, steps)``.
    num_classes : int
        Output classes.
    seed : int, optional
        Initialisation seed (None: torch's generator as it stands).
    width : int
        Channels of the CNN's convolutions or units of the MLP's hidden layer (0: 32 and 64,
        the defaults); a wider model has about ``5 * width**2`` (CNN) or
        ``width * (inputs + classes)`` (MLP) parameters.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if name in ("cnn", "cnn-bn"):
        if len(shape) != 2:
            raise ValueError(
                f"the cnn model needs (channels, steps) samples, got {tuple(shape)}: "
                "set model = 'mlp' for samples of another shape"
            )
        return SensorCNN(shape[0], num_classes, width or 32, norm=name == "cnn-bn")
    if name == "mlp":
        return SensorMLP(math.prod(shape), num_classes, *([width] if width else []))
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")
