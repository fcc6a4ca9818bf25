"""The task layer: what is learned, and how it is scored (Flower's ``task.py`` idiom).

- :mod:`~edge_client.task.models`: the model zoo (a 1D-CNN and an MLP for sensor windows);
- :mod:`~edge_client.task.datasets`: the built-in datasets (the synthetic sensor task, and
  scikit-learn's digits), with the held-out sets the aggregator evaluates on;
- :mod:`~edge_client.task.synthetic`: the synthetic sensor task;
- :mod:`~edge_client.task.evaluation`: accuracy and loss of a model on labelled samples;
- :mod:`~edge_client.task.constants`: shapes, classes, names.

Both the device runtime and the aggregator import it; it imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.task.datasets import Dataset, load_dataset
    from edge_client.task.evaluation import evaluate
    from edge_client.task.models import SensorCNN, SensorMLP, build_model
    from edge_client.task.synthetic import SensorTask

_EXPORTS = {
    "Dataset": "datasets",
    "SensorCNN": "models",
    "SensorMLP": "models",
    "SensorTask": "synthetic",
    "build_model": "models",
    "evaluate": "evaluation",
    "load_dataset": "datasets",
}
__all__ = [
    "Dataset",
    "SensorCNN",
    "SensorMLP",
    "SensorTask",
    "build_model",
    "evaluate",
    "load_dataset",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
