"""The built-in tasks' constants: the synthetic sensor windows, the digits, the model zoo."""

from __future__ import annotations

from typing import Final

# The names a run config takes (task, model, preprocessing, dataset) and the shapes and
# classes it checks against are part of the run config's contract: their home is the wire
# layer, which the task layer builds on (never the other way round).
from edge_client.wire.constants import (
    BUILTIN_TASKS,
    DATASETS,
    DEFAULT_NUM_CLASSES,
    DIGITS_CLASSES,
    DIGITS_SHAPE,
    IMPORT_PATH,
    MODELS,
    PREPROCESSING,
)

__all__ = [
    "BUILTIN_TASKS",
    "DATASETS",
    "DEFAULT_NUM_CLASSES",
    "DEFAULT_SHAPE",
    "DIGITS_CLASSES",
    "DIGITS_HELD_OUT",
    "DIGITS_SHAPE",
    "FORECAST_SCALE_FLOOR",
    "IMPORT_PATH",
    "MODELS",
    "PREPROCESSING",
    "TASK_SEED",
]

# --- Forecasting (edge_client.task.forecasting) -------------------------------------------
# Floor of a window's per-channel standard deviation, the unit the forecast model works in:
# only a constant window (a stuck sensor) reaches it, and its forecast is then the last
# reading. Far below any real sensor's spread, so that the model stays scale-free.
FORECAST_SCALE_FLOOR: Final = 1e-8

# --- The synthetic sensor task (edge_client.task.synthetic) -------------------------------
DEFAULT_SHAPE: Final = (6, 32)  # channels x time steps (accelerometer + gyroscope, 32 ticks)
TASK_SEED: Final = 20221217  # fixes the class prototypes: every device learns the same task

# --- scikit-learn's digits (edge_client.task.datasets) ------------------------------------
DIGITS_HELD_OUT: Final = 400  # images kept for evaluation, never streamed
