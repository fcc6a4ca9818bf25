"""A user's recording: labelled samples in a file, as ``fedstream publish --source``, ``fedstream
demo --source`` and server-side evaluation (``eval-data``) read them.

Two forms:

- ``.npz`` with arrays ``x`` (``(n, *sample_shape)``) and ``y`` (``(n,)`` integer labels);
- ``.csv`` with rows ``label,f1,f2,...`` (a header row is skipped); each row is a flat sample,
  reshaped to the declared shape when the sizes agree.
"""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["Recording", "load_recording"]

Recording = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]


def load_recording(path: str | Path, shape: Sequence[int] | None = None) -> Recording:
    """Load labelled samples from an ``.npz`` or ``.csv`` file.

    Parameters
    ----------
    path : str or Path
        The file.
    shape : sequence of int, optional
        Per-sample shape to give CSV rows (flat when omitted or when the sizes differ).

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
        x_raw, y_raw = _read_csv(path, shape)
    else:
        raise ValueError(f"{path}: recordings must be .npz or .csv")
    return _checked(path, np.asarray(x_raw), np.asarray(y_raw).reshape(-1))


def _read_csv(path: Path, shape: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if rows and not _is_number(rows[0][0]):
        rows = rows[1:]  # header
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
