"""Running a device daemon in the foreground until SIGTERM, SIGINT or SIGHUP (systemd, Ctrl-C, a
closed terminal), giving up with the reason when its first broker connection does not come
in time; and a stop signal turned into a :class:`threading.Event` safely."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Protocol

from edge_client.runtime.constants import STOP_SIGNALS
from edge_client.runtime.mqtt import BrokerOptions, BrokerURL, Connection

__all__ = [
    "Subscribed",
    "connected_or_raise",
    "run_connected",
    "run_until_signalled",
    "set_on_signals",
]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def set_on_signals(
    event: threading.Event | None = None,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    on_signal: Callable[[signal.Signals], None] | None = None,
) -> Iterator[threading.Event]:
    """Within the block, each of ``signals`` sets ``event`` (a new one when None: the block
    gets it) after ``on_signal(signum)``, if given, from a thread of its own; the previous
    handlers are back afterwards.

    A handler that set the event itself could hang the process for good: Python runs a
    handler in the main thread between two bytecodes, which may be inside ``event.wait``
    while it holds the event's lock (not reentrant), and ``event.set`` then waits for that
    lock forever (seen as a publisher that ignored SIGTERM on a loaded machine). The handler
    here only writes the signal's number to a pipe, which a thread reads.
    """
    stop = threading.Event() if event is None else event
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def handle(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: a signal is pending
            os.write(write_end, bytes([signum]))

    def relay() -> None:
        with open(read_end, "rb", buffering=0) as pipe:
            while data := pipe.read(64):
                for signum in data:
                    if on_signal is not None:
                        on_signal(signal.Signals(signum))
                    stop.set()

    thread = threading.Thread(target=relay, name="stop-signals", daemon=True)
    thread.start()
    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_end)  # the relay reads the end of the pipe and returns
        thread.join(timeout=5.0)


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
    # SIGHUP too: a daemon run in a terminal that closes stops cleanly, as on Ctrl-C
    with set_on_signals(on_signal=_log_stopping) as done:
        start()
        while not done.wait(1.0):
            if not worker.is_alive():
                raise RuntimeError(f"{name} thread died")
        stop()  # a second signal meanwhile changes nothing


def _log_stopping(signum: signal.Signals) -> None:
    log.info("received %s, stopping", signum.name)


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
