"""The default task: class-conditional multi-channel sensor windows.

Each class is a set of per-channel oscillations (frequency, amplitude, offset) that shares
most channels with the other classes, so telling classes apart needs the few channels
where they differ. Every sample gets a random phase, amplitude jitter and Gaussian noise: a
small 1D-CNN learns it well, a linear model on raw values does not. The class prototypes
come from :data:`~edge_client.task.constants.TASK_SEED`, so every device sees the same task.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from edge_client.task.constants import DEFAULT_NUM_CLASSES, DEFAULT_SHAPE, TASK_SEED

__all__ = ["SensorTask"]


class SensorTask:
    """Generator of labelled sensor windows of shape ``(channels, steps)``.

    Parameters
    ----------
    shape : (int, int)
        Channels and time steps per window.
    num_classes : int
        Number of classes.
    noise : float
        Standard deviation of the additive Gaussian noise (signal amplitudes are ~1).
    seed : int
        Seed of the class prototypes (not of the samples).
    """

    def __init__(
        self,
        shape: Sequence[int] = DEFAULT_SHAPE,
        num_classes: int = DEFAULT_NUM_CLASSES,
        noise: float = 1.5,
        seed: int = TASK_SEED,
    ) -> None:
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"shape must be (channels, steps), got {tuple(shape)}")
        if num_classes < 2:
            raise ValueError("need at least 2 classes")
        self.shape = (int(shape[0]), int(shape[1]))
        self.num_classes = num_classes
        self.noise = noise
        channels = self.shape[0]
        rng = np.random.default_rng(seed)
        # A shared "background" activity, then each class changes a few channels of it.
        base_f = rng.uniform(1.0, 4.0, channels)
        base_a = rng.uniform(0.6, 1.2, channels)
        base_b = rng.uniform(-0.3, 0.3, channels)
        self.freq = np.tile(base_f, (num_classes, 1))
        self.amp = np.tile(base_a, (num_classes, 1))
        self.offset = np.tile(base_b, (num_classes, 1))
        changed = max(1, channels // 3)
        for k in range(num_classes):
            idx = rng.choice(channels, changed, replace=False)
            self.freq[k, idx] = rng.uniform(1.0, 6.0, changed)
            self.amp[k, idx] = rng.uniform(0.4, 1.6, changed)
            self.offset[k, idx] = rng.uniform(-0.6, 0.6, changed)
        self._t = np.arange(self.shape[1]) / self.shape[1]

    def sample(
        self,
        n: int,
        rng: np.random.Generator,
        label_probs: npt.NDArray[np.float64] | None = None,
        shift: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Draw ``n`` labelled windows.

        Parameters
        ----------
        n : int
            Number of samples.
        rng : numpy.random.Generator
            Source of randomness for labels and noise.
        label_probs : ndarray, optional
            Class probabilities (uniform when omitted).
        shift : (gain, offset), optional
            Per-channel feature shift of a device: ``x * (1 + gain) + offset``.

        Returns
        -------
        x : ndarray, float32, ``(n, channels, steps)``
        y : ndarray, int64, ``(n,)``
        """
        y = rng.choice(self.num_classes, size=n, p=label_probs).astype(np.int64)
        phase = rng.uniform(0.0, 2 * np.pi, (n, 1, 1))
        jitter = 1.0 + 0.15 * rng.standard_normal((n, self.shape[0], 1))
        wave = np.sin(2 * np.pi * self.freq[y][:, :, None] * self._t + phase)
        x = self.amp[y][:, :, None] * jitter * wave + self.offset[y][:, :, None]
        x += self.noise * rng.standard_normal(x.shape)
        if shift is not None:
            gain, off = shift
            x = x * (1.0 + gain[None, :, None]) + off[None, :, None]
        return x.astype(np.float32), y

    def device_shift(
        self, rng: np.random.Generator, scale: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """A per-device feature shift (sensor gain and bias) of magnitude ``scale``."""
        channels = self.shape[0]
        return scale * rng.standard_normal(channels) * 0.5, scale * rng.standard_normal(channels)
