"""Drift: a change detector on a device's prequential error.

Each sample the device sees is first scored by the model it has (prequential: test, then
train or act), and the error goes to ADWIN (Bifet and Gavaldà, 2007), as River implements
it. ADWIN keeps a window of recent errors whose mean it tests against every split into an
older and a newer part; when they differ by more than a bound set by ``delta`` it drops the
older part and reports a change. Only changes that *raise* the error count as drift here
(ADWIN also reports the error falling, e.g. as the model learns).

Which error: 1 - the sample's score for a metric where higher is better (accuracy: 0 for a
right answer, 1 for a wrong one), the score itself otherwise (a forecast's absolute error).

Who feeds it: ``fedstream infer`` (every sample it predicts that carries its own answer: a
label, or a forecast window's last readings), and, with ``drift = "adwin"`` in the node
config, the ClientApp (the samples each round trains on). The detector's state lives in the
device's buffer file (:class:`~edge_client.runtime.device_state.DeviceStateStore`), so the
count of changes is in the device's status and in its replies, and survives restarts.

River is imported when the first watcher is made (about 1-3 s: River's package pulls in its
datasets module), never by a ClientApp that does not watch.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_DELTA", "DETECTORS", "DriftStatus", "DriftWatch", "errors_of"]

#: ADWIN's confidence: smaller waits for stronger evidence (River's default).
DEFAULT_DELTA = 0.002
#: Detectors a device can run: ``adwin``, or ``none``.
DETECTORS = ("adwin", "none")


def errors_of(scores: Iterable[float], higher_is_better: bool) -> list[float]:
    """The errors the detector watches for samples' scores by a task's metric (non-finite
    scores are left out)."""
    return [
        (1.0 - s) if higher_is_better else s for s in (float(v) for v in scores) if math.isfinite(s)
    ]


@dataclass
class DriftStatus:
    """What a device reports of its stream's drift (kebab-case in its status and replies).

    Attributes
    ----------
    changes : int
        Rises of the error detected so far.
    seen : int
        Errors watched so far.
    last_change : int
        ``seen`` when the last change was detected (-1: none).
    error : float
        The error's mean over ADWIN's current window (NaN before any).
    """

    changes: int = 0
    seen: int = 0
    last_change: int = -1
    error: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-safe."""
        return {
            "changes": self.changes,
            "seen": self.seen,
            "last-change": self.last_change,
            "error": None if math.isnan(self.error) else round(self.error, 6),
        }


class DriftWatch:
    """ADWIN on a stream of errors; counts the changes that raise the error.

    Parameters
    ----------
    delta : float
        ADWIN's confidence parameter (0 < delta < 1).
    """

    def __init__(self, delta: float = DEFAULT_DELTA) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"drift delta must lie in (0, 1), got {delta}")
        from river.drift import ADWIN  # heavy: only where a device watches

        self.delta = delta
        self.detector = ADWIN(delta=delta)  # type: ignore[no-untyped-call]
        self.status = DriftStatus()

    def update(self, errors: Iterable[float]) -> list[int]:
        """Watch ``errors`` in order; return the positions among them at which a rise was
        detected."""
        found = []
        for i, e in enumerate(errors):
            before = self.detector.estimation
            self.detector.update(e)  # type: ignore[no-untyped-call]
            self.status.seen += 1
            if self.detector.drift_detected and self.detector.estimation > before:
                self.status.changes += 1
                self.status.last_change = self.status.seen
                found.append(i)
        if self.status.seen:
            self.status.error = float(self.detector.estimation)
        return found

    def to_bytes(self) -> bytes:
        """The whole watcher (ADWIN's buckets included), to resume it in another process."""
        return pickle.dumps((self.delta, self.detector, self.status))

    @classmethod
    def from_bytes(cls, data: bytes, delta: float = DEFAULT_DELTA) -> DriftWatch:
        """A watcher :meth:`to_bytes` saved, or a fresh one (``delta``) if ``data`` is not
        one or was made with another ``delta``."""
        watch = cls(delta)
        try:
            saved_delta, detector, status = pickle.loads(data)
        except Exception:
            return watch
        if saved_delta == delta and isinstance(status, DriftStatus):
            watch.detector, watch.status = detector, status
        return watch
