"""The task layer: what is learned, and how it is scored (Flower's ``task.py`` idiom).

- :mod:`~edge_client.task.interface`: the :class:`Task` interface a user's task implements,
  the built-in :class:`Classification`, and :func:`evaluate`;
- :mod:`~edge_client.task.forecasting`: the built-in :class:`Forecast` (label-free streams);
- :mod:`~edge_client.task.loading`: a run's task from its run config (built in, or a user's
  by import path);
- :mod:`~edge_client.task.manifest`: what a model export's manifest says of the task;
- :mod:`~edge_client.task.preprocess`: preprocessing with state kept on the device
  (per-channel standardisation);
- :mod:`~edge_client.task.models`: the model zoo (a 1D-CNN and an MLP for sensor windows);
- :mod:`~edge_client.task.recordings`: a user's recorded samples (``.npz``, ``.csv``);
- :mod:`~edge_client.task.datasets`: the built-in datasets of emulated streams (the
  synthetic sensor task, scikit-learn's digits) and their held-out sets;
- :mod:`~edge_client.task.synthetic`: the synthetic sensor task;
- :mod:`~edge_client.task.diagnostics`: classification diagnostics (accuracy per class);
- :mod:`~edge_client.task.constants`: shapes, classes, names.

Both the device runtime and the aggregator import it; it imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.task.datasets import Dataset, load_dataset
    from edge_client.task.forecasting import Forecast
    from edge_client.task.interface import (
        Classification,
        ModelFactory,
        Scores,
        Task,
        evaluate,
        init_model,
    )
    from edge_client.task.loading import load_task
    from edge_client.task.models import SensorCNN, SensorMLP, build_model
    from edge_client.task.preprocess import ChannelStandardizer, Preprocessor
    from edge_client.task.recordings import load_recording, load_series, series_windows
    from edge_client.task.synthetic import SensorTask

_EXPORTS = {
    "ChannelStandardizer": "preprocess",
    "Classification": "interface",
    "Dataset": "datasets",
    "Forecast": "forecasting",
    "ModelFactory": "interface",
    "Preprocessor": "preprocess",
    "Scores": "interface",
    "SensorCNN": "models",
    "SensorMLP": "models",
    "SensorTask": "synthetic",
    "Task": "interface",
    "build_model": "models",
    "evaluate": "interface",
    "init_model": "interface",
    "load_dataset": "datasets",
    "load_recording": "recordings",
    "load_series": "recordings",
    "load_task": "loading",
    "series_windows": "recordings",
}
__all__ = [
    "ChannelStandardizer",
    "Classification",
    "Dataset",
    "Forecast",
    "ModelFactory",
    "Preprocessor",
    "Scores",
    "SensorCNN",
    "SensorMLP",
    "SensorTask",
    "Task",
    "build_model",
    "evaluate",
    "init_model",
    "load_dataset",
    "load_recording",
    "load_series",
    "load_task",
    "series_windows",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
