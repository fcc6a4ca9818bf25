"""Forecasting: a task that learns from unlabelled streams by predicting the next readings.

A sample is a window of ``C`` channels x ``W + H`` readings; the model sees the first ``W``
and predicts the last ``H`` of every channel, so the targets are cut from the stream itself
and labels are never read. Inputs and targets are taken relative to the window's last seen
reading (per channel): the model learns the change ahead, which keeps it independent of a
sensor's level, and a model that outputs zeros is the naive forecast (repeat the last
reading). The metric is the mean absolute error over the forecast (lower is better).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from edge_client.task.interface import Task

__all__ = ["Forecast", "ForecastNet", "Forecaster"]


class ForecastNet(nn.Module):
    """A linear autoregression plus a small MLP correction, over all channels' past
    readings; ``channels * horizon`` outputs.

    Starts as the naive forecast: the linear part is initialised to zero and the MLP's last
    layer too, so training moves away from "repeat the last reading" only as it helps.
    """

    def __init__(self, inputs: int, outputs: int, hidden: int = 64) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(inputs, outputs)
        head = nn.Linear(hidden, outputs)
        self.mlp = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), head)
        for layer in (self.linear, head):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forecast change of every channel, flattened ``(n, channels * horizon)``."""
        z = self.flatten(x)
        return self.linear(z) + self.mlp(z)  # type: ignore[no-any-return]


class Forecaster(nn.Module):
    """A forecast model's deployed form: whole windows of past readings in, the next
    ``horizon`` readings of every channel out, in the stream's own units.

    It does what :meth:`Forecast.targets` does to the inputs (readings relative to the last
    one) and adds the last reading back to the model's forecast change.
    """

    def __init__(self, model: nn.Module, horizon: int) -> None:
        super().__init__()
        self.model = model
        self.horizon = horizon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forecast ``(n, channels, horizon)`` from past windows ``(n, channels, W)``
        (or ``(n, W)``: one channel)."""
        windows = x.reshape(x.shape[0], 1, -1) if x.dim() == 2 else x
        last = windows[..., -1:]
        change = self.model(windows - last)
        return last + change.reshape(windows.shape[0], windows.shape[1], self.horizon)  # type: ignore[no-any-return]


class Forecast(Task):
    """Predict the next ``horizon`` readings of every channel from the rest of the window.

    Parameters
    ----------
    horizon : int
        Readings forecast (``H``); a sample holds ``W + H`` readings per channel.
    width : int
        Hidden units of the MLP correction (0: 64).
    """

    metric: ClassVar[str] = "mae"
    higher_is_better: ClassVar[bool] = False
    output: ClassVar[str] = "forecast"

    def __init__(self, horizon: int = 1, width: int = 0) -> None:
        if horizon < 1:
            raise ValueError(f"forecast-horizon must be >= 1, got {horizon}")
        self.horizon = horizon
        self.width = width or 64

    def build_model(self, shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        """A :class:`ForecastNet` for windows of ``shape`` (``num_outputs`` is not used: the
        outputs are the channels times the horizon)."""
        channels, steps = (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
        if len(shape) > 2 or steps <= self.horizon:
            raise ValueError(
                f"forecasting needs (channels, steps) or (steps,) windows longer than the "
                f"horizon ({self.horizon}), got sample-shape {shape}"
            )
        return ForecastNet(channels * (steps - self.horizon), channels * self.horizon, self.width)

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Past readings and the next ``horizon``, both relative to the last past reading
        (labels are ignored)."""
        windows = x.reshape(len(x), 1, -1) if x.dim() == 2 else x
        past, future = windows[..., : -self.horizon], windows[..., -self.horizon :]
        last = past[..., -1:]
        return past - last, (future - last).flatten(1)

    def predictor(self, model: nn.Module) -> nn.Module:
        """A :class:`Forecaster`: takes the ``W`` past readings of each channel (not the
        whole training window) and returns the next ``H`` in the stream's units."""
        return Forecaster(model, self.horizon)

    def input_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The past part of a window: ``W`` readings of each channel."""
        return (*shape[:-1], shape[-1] - self.horizon)

    def describe(self) -> dict[str, object]:
        """The forecast horizon (the deployed model takes ``W``, not ``W + H``, readings)."""
        return {"forecast-horizon": self.horizon}

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean absolute error (what the metric measures)."""
        return nn.functional.l1_loss(outputs, targets)

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Each window's mean absolute error over its forecast."""
        return (outputs - targets).abs().mean(1)
