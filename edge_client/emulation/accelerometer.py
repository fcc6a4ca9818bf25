"""A synthetic wrist or hip accelerometer in raw sensor units: a series to forecast.

Real recordings of this kind come in the sensor's counts (milli-g here), with gravity on one
axis: the scale that a forecaster must not depend on. The recording alternates walking and
standing; while walking, each axis carries the gait's fundamental (about 1.9 Hz, its cadence
drifting) and its second harmonic, with amplitudes that change from stride to stride; the
device's tilt moves gravity between two axes slowly; every reading has sensor noise and is
rounded to whole counts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edge_client.emulation.constants import ACCEL_GRAVITY, ACCEL_HZ

__all__ = ["accelerometer_series"]

# Per axis: the gait fundamental's and second harmonic's amplitudes (milli-g), their
# phases, and the sensor's noise (standard deviation, milli-g).
_GAIT = np.array([250.0, 150.0, 320.0])
_HARMONIC = np.array([80.0, 60.0, 120.0])
_PHASE = np.array([0.0, 1.2, 0.3])
_HARMONIC_PHASE = np.array([0.5, 0.0, 1.0])
_NOISE = np.array([15.0, 15.0, 20.0])
_BOUT_S = (20.0, 90.0)  # walking bouts last this long (uniform), ...
_REST_S = (3.0, 15.0)  # ... standing still between them this long


def accelerometer_series(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    """A 3-axis accelerometer recording at
    :data:`~edge_client.emulation.constants.ACCEL_HZ`, in milli-g counts.

    Parameters
    ----------
    seconds : float
        Length of the recording.
    seed : int
        Seeds every draw (bouts, cadence, stride amplitudes, noise).

    Returns
    -------
    ndarray
        ``(T, 3)`` float32 readings (``ax, ay, az``:
        :data:`~edge_client.emulation.constants.ACCEL_CHANNELS`), whole numbers;
        gravity (about 1000) mostly on ``az``.
    """
    rng = np.random.default_rng(seed)
    n = int(seconds * ACCEL_HZ)
    t = np.arange(n) / ACCEL_HZ
    walking = np.zeros(n)
    start = 0.0
    while start < seconds:  # alternate walking bouts and rests
        bout = rng.uniform(*_BOUT_S)
        walking[(t >= start) & (t < start + bout)] = 1.0
        start += bout + rng.uniform(*_REST_S)
    ramp = int(ACCEL_HZ)  # a second to start or stop walking
    walking = np.convolve(walking, np.ones(ramp) / ramp, mode="same")
    cadence = 1.9 + 0.1 * np.sin(2 * np.pi * t / 45.0) + np.cumsum(rng.normal(0, 0.002, n))
    phase = 2 * np.pi * np.cumsum(np.clip(cadence, 1.5, 2.3)) / ACCEL_HZ
    strides = np.floor(phase / (2 * np.pi)).astype(int)
    stride_gain = 1.0 + 0.15 * rng.normal(size=(strides.max() + 2, 3))
    gain = stride_gain[strides] * walking[:, None]
    gait = gain * _GAIT * np.sin(phase[:, None] + _PHASE)
    gait += gain * _HARMONIC * np.sin(2 * phase[:, None] + _HARMONIC_PHASE)
    tilt = 0.2 * np.sin(2 * np.pi * t / 75.0 + rng.uniform(0, 2 * np.pi))
    gravity = np.stack([ACCEL_GRAVITY * np.sin(tilt), np.zeros(n), ACCEL_GRAVITY * np.cos(tilt)], 1)
    noise = rng.normal(size=(n, 3)) * _NOISE
    readings: npt.NDArray[np.float32] = np.round(gravity + gait + noise).astype(np.float32)
    return readings
