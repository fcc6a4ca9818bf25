"""Stopping a run after a whole round: SIGTERM or SIGINT, or a ``STOP`` file.

A continuous run (``num-rounds = 0``) trains until asked to stop; a bounded one can be
stopped early the same way. The request is honoured at the next round boundary
(asynchronous mode: after the next aggregation), once the round is checkpointed and logged,
so the run ends whole and ``resume = true`` continues it with the next round. Two ways to
ask:

- a signal to the ServerApp's process (SIGTERM, as systemd and ``kill`` send it, or SIGINT).
  A second signal gets the handler that was there before (Flower's: exit at once; the
  checkpoint of the last round is kept);
- a file named ``STOP`` in ``checkpoint-dir`` or ``out-dir`` (``fedstream stop DIR``), for a
  ServerApp that runs in a process one cannot signal (under a SuperLink on another host).
  It is removed when honoured; one left from before the run started is removed at the start.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_FILE", "StopRequest", "request_stop", "wait_taken"]

log = logging.getLogger(__name__)

#: Name of the file that asks a run to stop after its current round.
STOP_FILE = "STOP"
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def request_stop(directory: str | Path) -> Path:
    """Ask the run whose ``checkpoint-dir`` or ``out-dir`` is ``directory`` to stop after
    its current round; return the file written."""
    path = Path(directory) / STOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("stop after the current round\n")
    return path


class StopRequest:
    """Watches for a request to stop (a context manager: handlers are installed on entry,
    where possible, and restored on exit).

    Parameters
    ----------
    directories : iterable of path
        Where a ``STOP`` file is looked for (empty strings are skipped).
    """

    def __init__(self, directories: Iterable[str | Path]) -> None:
        self.files = [Path(d) / STOP_FILE for d in directories if str(d)]
        self._signal: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for path in self.files:
            if path.exists():
                log.warning("removing %s, left from before this run", path)
                path.unlink(missing_ok=True)
        # Signal handlers can be set only from the main thread (Flower's engines run the
        # ServerApp there; a test's or a notebook's thread falls back to the STOP file).
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signal = signal.Signals(signum).name
        log.warning("%s: stopping after the current round (again to stop at once)", self._signal)
        self._restore()  # a second signal: whatever handled it before

    def requested(self) -> str | None:
        """Why the run should stop now (``SIGTERM``, ``STOP file <path>``), or None.

        A ``STOP`` file found is removed: it asks once.
        """
        if self._signal is not None:
            return self._signal
        for path in self.files:
            if path.exists():
                path.unlink(missing_ok=True)
                return f"STOP file {path}"
        return None


def wait_taken(path: str | Path, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Whether the stop request ``path`` (from :func:`request_stop`) was taken by its run
    within ``timeout_s``: a run removes the file once it has checkpointed the round it stops
    after."""
    deadline = time.monotonic() + timeout_s
    while Path(path).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
