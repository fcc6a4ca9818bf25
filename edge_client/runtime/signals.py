"""Running a device daemon in the foreground until SIGTERM, SIGINT or SIGHUP (systemd, Ctrl-C, a
closed terminal), giving up with the reason when its first broker connection does not come
in time."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from edge_client.runtime.mqtt import BrokerOptions, BrokerURL, Connection

__all__ = ["Subscribed", "connected_or_raise", "run_connected", "run_until_signalled"]

log = logging.getLogger(__name__)


def run_until_signalled(
    start: Callable[[], None],
    stop: Callable[[], None],
    worker: threading.Thread,
    name: str,
) -> None:
    """``start()``, wait for SIGTERM, SIGINT or SIGHUP, then ``stop()``.

    Raises
    ------
    RuntimeError
        If ``worker`` (the daemon's thread) dies meanwhile.
    """
    done = threading.Event()

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        done.set()

    # SIGHUP too: a daemon run in a terminal that closes stops cleanly, as on Ctrl-C
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handle)
    start()
    while not done.wait(1.0):
        if not worker.is_alive():
            raise RuntimeError(f"{name} thread died")
    stop()


def connected_or_raise(
    wait_connected: Callable[[float], bool],
    connection: Connection,
    broker: BrokerURL,
    timeout: float | None,
    stop: Callable[[], None],
) -> None:
    """With a ``timeout``: wait that long for the first connection; if it does not come,
    ``stop()`` and raise.

    Raises
    ------
    ConnectionError
        Saying why the last attempt failed.
    """
    if timeout is not None and not wait_connected(timeout):
        why = connection.last_error or "no answer"
        stop()
        raise ConnectionError(f"could not connect to {broker} within {timeout:g} s: {why}")


class Subscribed:
    """A device daemon that is up once its broker connection has subscribed: it sets
    ``_connected`` then (the ingest and inference daemons)."""

    _connected: threading.Event

    def wait_connected(self, timeout: float) -> bool:
        """Block until subscribed to the broker, or ``timeout`` seconds."""
        return self._connected.wait(timeout)


class Daemon(Protocol):
    """A device daemon :func:`run_connected` runs (the ingest and inference daemons)."""

    connection: Connection

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def wait_connected(self, timeout: float) -> bool: ...


def run_connected(daemon: Daemon, broker: BrokerURL, worker: threading.Thread, name: str) -> None:
    """Run ``daemon`` until SIGTERM, SIGINT or SIGHUP; with the broker's ``connect_timeout``
    (:class:`~edge_client.runtime.mqtt.BrokerOptions`), give up if its first connection has
    not come by then.

    Raises
    ------
    ConnectionError
        If the first connection did not succeed in time (saying why the last attempt failed).
    RuntimeError
        If ``worker`` (the daemon's thread, named ``name``) dies.
    """

    def start() -> None:
        daemon.start()
        timeout = BrokerOptions.of(broker).connect_timeout
        connected_or_raise(daemon.wait_connected, daemon.connection, broker, timeout, daemon.stop)

    run_until_signalled(start, daemon.stop, worker, name)
