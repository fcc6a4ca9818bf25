"""The built-in tasks' constants: the synthetic sensor windows, the digits, the model zoo."""

from __future__ import annotations

import re
from typing import Final

MODELS: Final = ("cnn", "mlp")  # built-in models (a user names theirs by import path)
BUILTIN_TASKS: Final = ("classification", "forecast")  # a user names theirs by import path
#: A user's task or model in the run config: ``package.module:Name`` (``module:Outer.Inner``).
IMPORT_PATH: Final = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
PREPROCESSING: Final = ("none", "standardize")  # the built-in task's preprocessing
DATASETS: Final = ("synthetic", "digits")  # what a stream can carry

# --- Forecasting (edge_client.task.forecasting) -------------------------------------------
# Floor of a window's per-channel standard deviation, the unit the forecast model works in:
# only a constant window (a stuck sensor) reaches it, and its forecast is then the last
# reading. Far below any real sensor's spread, so that the model stays scale-free.
FORECAST_SCALE_FLOOR: Final = 1e-8

# --- The synthetic sensor task (edge_client.task.synthetic) -------------------------------
DEFAULT_SHAPE: Final = (6, 32)  # channels x time steps (accelerometer + gyroscope, 32 ticks)
DEFAULT_NUM_CLASSES: Final = 6
TASK_SEED: Final = 20221217  # fixes the class prototypes: every device learns the same task

# --- scikit-learn's digits (edge_client.task.datasets) ------------------------------------
DIGITS_SHAPE: Final = (8, 8)  # 8x8 digit images: 8 rows x 8 columns
DIGITS_CLASSES: Final = 10
DIGITS_HELD_OUT: Final = 400  # images kept for evaluation, never streamed
