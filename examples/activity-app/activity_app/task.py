"""What this app learns: activities from 3-axis accelerometer windows (3 x 50 readings).

A user's task for fedstream: the model is this app's own (a small convolution, then a GRU
over time), each device standardises its own accelerometer's axes (watches differ in gain
and offset), and the metric is accuracy. fedstream brings the streams, the batch plans, the
codec and the faults.
"""

from __future__ import annotations

import torch
from edge_client.task import ChannelStandardizer, Preprocessor, Task
from torch import nn


class ActivityNet(nn.Module):
    """Conv1d features over time, a GRU that summarises them, a linear head."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, hidden: int = 24) -> None:
        super().__init__()
        channels = shape[0]
        self.conv = nn.Sequential(nn.Conv1d(channels, 16, kernel_size=5, padding=2), nn.ReLU())
        self.gru = nn.GRU(16, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for windows ``(n, axes, steps)``."""
        features = self.conv(x).transpose(1, 2)  # (n, steps, 16)
        _, last = self.gru(features)
        return self.head(last[-1])  # type: ignore[no-any-return]


class ActivityTask(Task):
    """Classify a window's activity (the run config's ``num-classes`` of them)."""

    metric = "accuracy"

    def build_model(self, shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        if len(shape) != 2:
            raise ValueError(f"activity windows are (axes, steps), got {shape}")
        return ActivityNet(shape, num_outputs)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets)

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.argmax(1) == targets).float()

    def preprocessor(self) -> Preprocessor | None:
        return ChannelStandardizer()  # per watch, from its own stream
