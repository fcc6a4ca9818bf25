"""A user's recording: labelled samples in a file, as ``fedstream publish --source``, ``fedstream
demo --source`` and server-side evaluation (``eval-data``) read them.

Two forms:

- ``.npz`` with arrays ``x`` (``(n, *sample_shape)``) and ``y`` (``(n,)`` integer labels);
- ``.csv`` with rows ``label,f1,f2,...`` (a header row is skipped); each row is a flat sample,
  reshaped to the declared shape when the sizes agree.

A recording may also say whose each sample is (a subject, a machine): an array ``KEY`` of
``n`` integers or strings in the ``.npz``, or a column the ``.csv``'s header names ``KEY``
(left out of the features). :func:`load_groups` reads it; the samples stay in recorded order.
"""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "TIME_COLUMNS",
    "Recording",
    "load_groups",
    "load_recording",
    "load_series",
    "recording_keys",
    "series_windows",
]

#: CSV columns that hold time, not a channel (skipped by :func:`load_series`).
TIME_COLUMNS = ("date", "time", "ts", "timestamp")

Recording = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]


def load_recording(
    path: str | Path, shape: Sequence[int] | None = None, group_key: str | None = None
) -> Recording:
    """Load labelled samples from an ``.npz`` or ``.csv`` file.

    Parameters
    ----------
    path : str or Path
        The file.
    shape : sequence of int, optional
        Per-sample shape to give CSV rows (flat when omitted or when the sizes differ).
    group_key : str, optional
        A CSV column that names whose each sample is (:func:`load_groups`): not a feature.

    Returns
    -------
    tuple
        Samples ``x`` (float32) and labels ``y`` (int64).

    Raises
    ------
    ValueError
        If the file is missing, not one of these forms, empty, has as many labels as
        samples, labels that are not whole numbers >= 0, or values that are not finite.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path) as data:
                if "x" not in data or "y" not in data:
                    raise ValueError(f"{path}: an .npz recording needs arrays 'x' and 'y'")
                x_raw, y_raw = data["x"], data["y"]
        except (OSError, EOFError, zipfile.BadZipFile) as err:  # not a zip, truncated
            raise ValueError(f"{path}: not a readable .npz file ({err})") from err
    elif path.suffix == ".csv":
        x_raw, y_raw = _read_csv(path, shape, group_key)
    else:
        raise ValueError(f"{path}: recordings must be .npz or .csv")
    return _checked(path, np.asarray(x_raw), np.asarray(y_raw).reshape(-1))


def recording_keys(path: str | Path) -> list[str]:
    """What a recording holds: the ``.npz``'s arrays, or the ``.csv``'s named columns (none
    without a header row)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as data:
            return list(data.files)
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
    return header if header and not _is_number(header[0]) else []


def load_groups(path: str | Path, key: str) -> npt.NDArray[np.str_]:
    """Whose each sample of a recording is: the ``.npz``'s array ``key`` or the ``.csv``'s
    column ``key``, as strings, in recorded order.

    Raises
    ------
    ValueError
        If the file has no such array or column (the message names those it has), or it is
        not one value per sample.
    """
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as data:
            if key not in data:
                raise ValueError(
                    f"{path} has no array {key!r} to partition by; it has: "
                    f"{', '.join(recording_keys(path))}"
                )
            groups = np.asarray(data[key])
            n = len(data["y"]) if "y" in data else len(groups)
    elif path.suffix == ".csv":
        with path.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            if key not in header:
                named = ", ".join(recording_keys(path)) or "none"
                raise ValueError(
                    f"{path} has no column {key!r} to partition by (a header row names the "
                    f"columns); its columns: {named}"
                )
            at = header.index(key)
            groups = np.array([row[at] for row in reader if row])
        n = len(groups)
    else:
        raise ValueError(f"{path}: recordings must be .npz or .csv")
    if groups.ndim != 1 or len(groups) != n:
        raise ValueError(f"{path}: {key!r} must hold one value per sample, got {groups.shape}")
    return groups.astype(str)


def _read_csv(
    path: Path, shape: Sequence[int] | None, group_key: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if rows and not _is_number(rows[0][0]):
        header, rows = rows[0], rows[1:]
        if group_key in header:  # whose the sample is: not a feature
            at = header.index(group_key)
            rows = [r[:at] + r[at + 1 :] for r in rows]
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ValueError(f"{path}: rows have different widths {sorted(widths)}")
    try:
        table = np.array([[float(v) for v in r] for r in rows], dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{path}: rows must be numbers 'label,f1,f2,...': {err}") from err
    if table.ndim != 2 or table.shape[1] < 2:
        raise ValueError(f"{path}: need rows 'label,f1,f2,...'")
    x = table[:, 1:]
    if shape is not None and math.prod(shape) == x.shape[1]:
        x = x.reshape(len(x), *shape)
    return x, table[:, 0]


def _checked(path: Path, x: np.ndarray, y: np.ndarray) -> Recording:
    if len(x) == 0:
        raise ValueError(f"{path}: no samples")
    if len(x) != len(y):
        raise ValueError(f"{path}: {len(x)} samples but {len(y)} labels")
    if x.ndim < 2:
        raise ValueError(f"{path}: samples must be arrays, got x of shape {x.shape}")
    try:
        xf = x.astype(np.float32)
        yf = y.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: samples and labels must be numbers ({err})") from err
    if not np.all(np.isfinite(xf)):
        raise ValueError(f"{path}: samples hold NaN or infinite values")
    if not np.all(np.isfinite(yf)) or np.any(yf < 0) or np.any(yf != np.round(yf)):
        raise ValueError(f"{path}: labels must be whole numbers >= 0 (class indices)")
    return xf, yf.astype(np.int64)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def series_windows(values: np.ndarray, length: int, stride: int = 1) -> npt.NDArray[np.float32]:
    """Windows of ``length`` consecutive readings of a recorded series, every ``stride``
    readings: what a forecasting task's samples are.

    Parameters
    ----------
    values : ndarray
        Readings ``(T,)`` of one channel or ``(T, C)`` of ``C``.
    length, stride : int
        Readings per window, and between window starts.

    Returns
    -------
    ndarray
        ``(n, C, length)`` float32, ``n = (T - length) // stride + 1``.

    Raises
    ------
    ValueError
        If the series is shorter than one window, or holds NaN.
    """
    series = np.asarray(values, dtype=np.float32)
    series = series[:, None] if series.ndim == 1 else series
    if length < 1 or stride < 1 or len(series) < length:
        raise ValueError(f"need at least {length} readings for a window, got {len(series)}")
    if not np.all(np.isfinite(series)):
        raise ValueError("the series holds NaN or infinite readings: fill them first")
    starts = np.arange(0, len(series) - length + 1, stride)
    return np.stack([series[i : i + length].T for i in starts])


def load_series(path: str | Path) -> npt.NDArray[np.float32]:
    """A recorded series of readings, ``(T, C)``: an ``.npz`` with an array ``x`` of shape
    ``(T,)`` or ``(T, C)``, or a ``.csv`` with a header row, one column per channel (columns
    named ``date``, ``time``, ``ts`` or ``timestamp`` are skipped). Empty cells (readings
    that are missing) are filled linearly between their neighbours.

    Raises
    ------
    ValueError
        If the file is missing or not of these forms, a channel has no reading at all, or a
        cell is not a number.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".npz":
        with np.load(path) as data:
            if "x" not in data:
                raise ValueError(f"{path}: a series .npz needs an array 'x' (T,) or (T, C)")
            values = np.asarray(data["x"], dtype=np.float64)
    elif path.suffix == ".csv":
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        columns = [c for c in (rows[0] if rows else {}) if c.lower() not in TIME_COLUMNS]
        if not columns:
            raise ValueError(f"{path}: need a header row and at least one channel column")
        try:
            values = np.array(
                [[float(r[c]) if r[c] not in ("", None) else np.nan for c in columns] for r in rows]
            )
        except ValueError as err:
            raise ValueError(f"{path}: readings must be numbers: {err}") from err
    else:
        raise ValueError(f"{path}: series must be .npz or .csv")
    values = values[:, None] if values.ndim == 1 else values
    if values.ndim != 2 or len(values) < 2:
        raise ValueError(f"{path}: need readings (T,) or (T, C), got shape {values.shape}")
    index = np.arange(len(values))
    for c in range(values.shape[1]):
        missing = ~np.isfinite(values[:, c])
        if missing.all():
            raise ValueError(f"{path}: channel {c} has no reading")
        values[missing, c] = np.interp(index[missing], index[~missing], values[~missing, c])
    return values.astype(np.float32)
