"""Preprocessing a device keeps state for: per-channel standardisation from running
statistics of its own stream.

A device's sensors have their own gain and offset; standardising each channel by what that
device has seen so far removes them without the aggregator ever seeing a sample. The state
(a count, a mean and a sum of squared deviations per channel) lives in the device's buffer
file between rounds (:class:`~edge_client.runtime.device_state.DeviceStateStore`). It is
computed from features only, never labels, so a device may update it with the samples it is
about to evaluate prequentially.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["ChannelStandardizer", "Preprocessor"]

EPS = 1e-6  # floor of a channel's standard deviation: a constant channel stays finite


class Preprocessor(Protocol):
    """A preprocessing step with state: updated from samples, applied to samples."""

    def update(self, x: npt.NDArray[np.float32]) -> None:
        """Take the samples ``x`` (``(n, *shape)``) into the running state."""

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``x`` preprocessed (a new array)."""

    def state_dict(self) -> dict[str, Any]:
        """The state, as JSON-serialisable values."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state :meth:`state_dict` returned."""


class ChannelStandardizer:
    """Standardise each channel (axis 1 of a batch: the sample's first axis) to zero mean
    and unit variance, by running statistics over every sample seen (Chan et al.'s
    parallel update, exact whatever the batch sizes). Before any sample it is the
    identity."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: npt.NDArray[np.float64] | None = None
        self.m2: npt.NDArray[np.float64] | None = None

    def update(self, x: npt.NDArray[np.float32]) -> None:
        """Add the values of ``x`` to each channel's statistics."""
        if len(x) == 0:
            return
        values = _by_channel(x)
        n = values.shape[1]
        mean = values.mean(axis=1)
        m2 = ((values - mean[:, None]) ** 2).sum(axis=1)
        if self.mean is None or self.m2 is None or len(self.mean) != len(mean):
            self.count, self.mean, self.m2 = n, mean, m2
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> npt.NDArray[np.float64] | None:
        """Each channel's standard deviation so far (None before any sample)."""
        if self.m2 is None or self.count == 0:
            return None
        return np.sqrt(self.m2 / self.count)

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``x`` with each channel standardised (unchanged before any sample)."""
        std = self.std
        if self.mean is None or std is None or x.ndim < 2 or x.shape[1] != len(self.mean):
            return np.array(x, dtype=np.float32)
        shape = (1, len(self.mean)) + (1,) * (x.ndim - 2)
        out = (x - self.mean.reshape(shape)) / np.maximum(std, EPS).reshape(shape)
        return out.astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """Count, per-channel mean and sum of squared deviations."""
        return {
            "count": self.count,
            "mean": [] if self.mean is None else self.mean.tolist(),
            "m2": [] if self.m2 is None else self.m2.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises
        ------
        ValueError
            If it is not one (missing keys, or lists of different lengths).
        """
        try:
            count = int(state["count"])
            mean = np.asarray(state["mean"], dtype=np.float64)
            m2 = np.asarray(state["m2"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a standardiser's state: {err}") from err
        if mean.shape != m2.shape or mean.ndim != 1 or count < 0:
            raise ValueError("not a standardiser's state: mean and m2 differ in shape")
        self.count = count
        self.mean, self.m2 = (mean, m2) if count else (None, None)


def _by_channel(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """``(channels, values)``: every value of each channel of a batch ``(n, c, ...)`` (a flat
    sample ``(n, f)`` is ``f`` channels of one value each)."""
    values = np.asarray(x, dtype=np.float64)
    if values.ndim < 2:
        values = values.reshape(len(values), 1)
    return np.moveaxis(values, 1, 0).reshape(values.shape[1], -1)
