"""What an emulated stream can carry: the synthetic sensor task, scikit-learn's digits as
frames, or a user's recording.

The built-in datasets serve the simulation engine, the in-process runner and the benchmarks
(``dataset`` in the run config); a real deployment streams whatever its sensors send.

``synthetic`` is :class:`~edge_client.task.synthetic.SensorTask`: windows of any
``(channels, steps)`` shape (the run's ``sample-shape``; 6 x 32 by default), any class count.
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

    @classmethod
    def from_arrays(cls, name: str, train: Arrays, test: Arrays | None = None) -> Dataset:
        """A dataset of recorded samples (a user's recording): shape and class count from
        the samples (classes ``0 .. max label``)."""
        x, y = train
        labels = y if test is None else np.concatenate([y, test[1]])
        shape = tuple(int(d) for d in x.shape[1:])
        return cls(name, shape, int(labels.max()) + 1, train=train, test=test or train)


def load_dataset(
    name: str,
    shape: tuple[int, ...] = DEFAULT_SHAPE,
    num_classes: int = DEFAULT_NUM_CLASSES,
) -> Dataset:
    """The built-in dataset called ``name`` (one of
    :data:`~edge_client.task.constants.DATASETS`) for samples of ``shape`` and
    ``num_classes`` classes.

    Raises
    ------
    ValueError
        On an unknown name, or a shape or class count the dataset cannot give; the
        message names the run-config keys to set.
    """
    if name == "synthetic":
        if len(shape) != 2:
            raise ValueError(
                f"the synthetic dataset streams (channels, steps) windows: sample-shape "
                f"{','.join(map(str, shape))} has {len(shape)} axes"
            )
        return Dataset(name, tuple(shape), num_classes, task=SensorTask(shape, num_classes))
    if name == "digits":
        if num_classes != DIGITS_CLASSES or tuple(shape) != DIGITS_SHAPE:
            raise ValueError(
                f"digits are {DIGITS_SHAPE[0]}x{DIGITS_SHAPE[1]} frames of {DIGITS_CLASSES} "
                f"classes: set sample-shape='8,8' and num-classes={DIGITS_CLASSES}"
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
