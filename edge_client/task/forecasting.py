"""Forecasting: a task that learns from unlabelled streams by predicting the next readings.

A sample is a window of ``C`` channels x ``W + H`` readings; the model sees the first ``W``
and predicts the last ``H`` of every channel, so the targets are cut from the stream itself
and labels are never read. The metric is the mean absolute error over the forecast, in the
stream's own units (lower is better).

The task is scale-free, as RevIN (Kim et al., ICLR 2022) makes a forecaster: a CO2 series in
ppm and an accelerometer in milli-g train at one learning rate.

- Inputs and targets are taken relative to the window's last seen reading (per channel), so
  a sensor's level (a gravity offset, 400 ppm of CO2) never reaches the model.
- Inside the model, each window is divided by its own standard deviation per channel (floored
  at :data:`~edge_client.task.constants.FORECAST_SCALE_FLOOR`), and the forecast is
  multiplied back: the model's outputs are in the stream's units, and a model, exported or
  not, carries no statistics of any device. Forecasting ``a * x + b`` (``a > 0``) gives
  ``a`` times the forecast of ``x``, plus ``b``.
- The loss is the absolute error in units of each training window's standard deviation
  (past and horizon together, per channel: bounded for the naive forecast whatever the
  window), so gradients do not grow with the sensor's scale.
- A model that outputs zeros is the naive forecast (repeat the last reading), and the model
  starts as exactly that.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from edge_client.task.constants import FORECAST_SCALE_FLOOR
from edge_client.task.interface import Task

__all__ = ["Forecast", "ForecastNet", "Forecaster", "window_scale"]


def window_scale(windows: torch.Tensor) -> torch.Tensor:
    """Each channel's standard deviation over a window's readings, ``(n, C, 1)`` from
    ``(n, C, T)``, floored at :data:`~edge_client.task.constants.FORECAST_SCALE_FLOOR`
    (smoothly: a constant window stays finite)."""
    variance = windows.var(dim=-1, keepdim=True, correction=0)
    return torch.sqrt(variance + FORECAST_SCALE_FLOOR**2)


class ForecastNet(nn.Module):
    """A linear autoregression plus a small MLP correction, over all channels' past
    readings, in units of each window's own spread; ``channels * horizon`` outputs in the
    inputs' units.

    Takes past readings relative to the last one, ``(n, channels, past)``; divides each
    channel by its standard deviation over the window (:func:`window_scale`), forecasts the
    change ahead in those units, and multiplies it back. Starts as the naive forecast: the
    linear part is initialised to zero and the MLP's last layer too, so training moves away
    from "repeat the last reading" only as it helps.

    Parameters
    ----------
    channels, past, horizon : int
        The window's channels, its past readings (``W``) and the readings forecast (``H``).
    hidden : int
        Hidden units of the MLP correction.
    """

    def __init__(self, channels: int, past: int, horizon: int, hidden: int = 64) -> None:
        super().__init__()
        self.channels, self.past, self.horizon = channels, past, horizon
        inputs, outputs = channels * past, channels * horizon
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(inputs, outputs)
        head = nn.Linear(hidden, outputs)
        self.mlp = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), head)
        for layer in (self.linear, head):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forecast change of every channel, flattened ``(n, channels * horizon)``, in
        the units of ``x`` (past readings relative to the last, ``(n, channels, past)``)."""
        windows = x.reshape(x.shape[0], self.channels, self.past)
        scale = window_scale(windows)
        z = self.flatten(windows / scale)
        change = (self.linear(z) + self.mlp(z)).reshape(x.shape[0], self.channels, self.horizon)
        return (change * scale).flatten(1)  # type: ignore[no-any-return]


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
        return ForecastNet(channels, steps - self.horizon, self.horizon, self.width)

    def relative(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The window's past readings ``(n, C, W)`` and its next ``horizon`` ``(n, C, H)``,
        both relative to the last past reading of their channel, in the stream's units."""
        windows = x.reshape(len(x), 1, -1) if x.dim() == 2 else x
        relative = windows - windows[..., -self.horizon - 1 : -self.horizon]
        return relative[..., : -self.horizon], relative[..., -self.horizon :]

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's inputs and targets (labels are ignored).

        Returns
        -------
        tuple of Tensor
            The past readings relative to the last one ``(n, C, W)`` (:meth:`relative`), and
            per channel the next ``horizon`` relative to it followed by the whole window's
            standard deviation (:func:`window_scale`, the unit of the loss), ``(n, C, H + 1)``.
        """
        past, ahead = self.relative(x)
        scale = window_scale(torch.cat([past, ahead], -1))
        return past, torch.cat([ahead, scale], -1)

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
        """Mean absolute error in units of each window's standard deviation per channel:
        scale-free, so that one learning rate fits any sensor."""
        errors, scale = self._errors(outputs, targets)
        return (errors / scale).mean()

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Each window's mean absolute error over its forecast, in the stream's units."""
        errors, _ = self._errors(outputs, targets)
        return errors.flatten(1).mean(1)

    def _errors(
        self, outputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Absolute errors ``(n, C, H)`` of the forecast changes ``outputs`` against
        :meth:`targets`' ``targets``, and each window's scale ``(n, C, 1)``."""
        ahead, scale = targets[..., : self.horizon], targets[..., self.horizon :]
        return (outputs.reshape(ahead.shape) - ahead).abs(), scale
