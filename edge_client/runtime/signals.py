"""Running a device daemon in the foreground until SIGTERM or SIGINT (systemd, Ctrl-C)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["run_until_signalled"]

log = logging.getLogger(__name__)


def run_until_signalled(
    start: Callable[[], None],
    stop: Callable[[], None],
    worker: threading.Thread,
    name: str,
) -> None:
    """``start()``, wait for SIGTERM or SIGINT, then ``stop()``.

    Raises
    ------
    RuntimeError
        If ``worker`` (the daemon's thread) dies meanwhile.
    """
    done = threading.Event()

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    start()
    while not done.wait(1.0):
        if not worker.is_alive():
            raise RuntimeError(f"{name} thread died")
    stop()
