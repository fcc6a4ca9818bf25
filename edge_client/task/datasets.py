"""What a stream can carry: the synthetic sensor task, or scikit-learn's digits as frames.

``synthetic`` is :class:`~edge_client.task.synthetic.SensorTask` (6-axis windows, 6 activities).
``digits`` is scikit-learn's bundled 8x8 handwritten digits (1,797 real images, 10 classes),
streamed as camera frames of 8 rows x 8 columns: a second, real dataset that ships inside a
pip package (``pip install 'fedstream[bench]'``). 400 images are held out for the
aggregator's evaluation and never streamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
import numpy.typing as npt

from edge_client.task.constants import (
    DATASETS,
    DEFAULT_NUM_CLASSES,
    DEFAULT_SHAPE,
    DIGITS_CLASSES,
    DIGITS_HELD_OUT,
    DIGITS_SHAPE,
)
from edge_client.task.synthetic import SensorTask

__all__ = ["Dataset", "load_dataset"]

EVAL_STREAM = 999  # seed stream of the synthetic held-out samples

Arrays = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]


@dataclass(frozen=True)
class Dataset:
    """A dataset as streams see it: per-sample shape, classes, the samples, a held-out set.

    Streams of it are made by :func:`edge_client.emulation.sources.dataset_source`.
    """

    name: str
    shape: tuple[int, ...]
    num_classes: int
    task: SensorTask | None = None  # synthetic only
    train: Arrays | None = field(default=None, repr=False)  # digits only
    test: Arrays | None = field(default=None, repr=False)

    def eval_set(self, n: int, seed: int) -> Arrays:
        """The held-out samples the aggregator evaluates on (at most ``n``)."""
        if self.task is not None:
            return self.task.sample(n, np.random.default_rng([seed, EVAL_STREAM]))
        assert self.test is not None
        return self.test[0][:n], self.test[1][:n]


def load_dataset(name: str, num_classes: int = DEFAULT_NUM_CLASSES) -> Dataset:
    """The dataset called ``name`` (one of :data:`~edge_client.task.constants.DATASETS`).

    Raises
    ------
    ValueError
        On an unknown name, or a class count the dataset does not have.
    """
    if name == "synthetic":
        return Dataset(
            name, DEFAULT_SHAPE, num_classes, task=SensorTask(DEFAULT_SHAPE, num_classes)
        )
    if name == "digits":
        if num_classes != DIGITS_CLASSES:
            raise ValueError(
                f"digits has {DIGITS_CLASSES} classes: set num-classes={DIGITS_CLASSES}"
            )
        train, test = _digits()
        return Dataset(name, DIGITS_SHAPE, DIGITS_CLASSES, train=train, test=test)
    raise ValueError(f"dataset must be one of {DATASETS}, got {name!r}")


@cache
def _digits() -> tuple[Arrays, Arrays]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ValueError(
            "the digits dataset needs scikit-learn: pip install 'fedstream[bench]'"
        ) from err
    data = load_digits()
    x = (data.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # grey levels 0..16 -> [-1, 1]
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))  # a fixed split, every run
    test, train = order[:DIGITS_HELD_OUT], order[DIGITS_HELD_OUT:]
    return (x[train], y[train]), (x[test], y[test])
