"""A stop signal sets its event without hanging the process (``set_on_signals``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from edge_client.runtime.signals import set_on_signals

pytestmark = pytest.mark.unit

#: The handler runs while the main thread holds the event's lock, as it does for a moment on
#: entering and leaving ``event.wait`` (the window a loaded machine hits): a handler that
#: sets the event itself waits for that lock forever. ``_cond`` is CPython's lock of the
#: event, held here to open the window deterministically.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from edge_client.runtime.signals import set_on_signals

    seen = []
    HANDLER = sys.argv[1]
    event = threading.Event()
    if HANDLER == "direct":  # what the publisher did before
        signal.signal(signal.SIGTERM, lambda *_: event.set())
        guard = None
    else:
        guard = set_on_signals(event, on_signal=seen.append)
        guard.__enter__()
    with event._cond:  # the main thread inside event.wait's lock
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, between two bytecodes
    print("set" if event.wait(5.0) else "not set", [s.name for s in seen], flush=True)
    if guard is not None:
        guard.__exit__(None, None, None)
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    """
)


def run_script(handler: str, timeout: float) -> subprocess.CompletedProcess[str] | None:
    """The script in a fresh interpreter; None if it hung (killed after ``timeout`` s)."""
    try:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, handler], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None


def test_a_stop_signal_sets_the_event_while_the_main_thread_holds_its_lock() -> None:
    # Execute
    done = run_script("relayed", timeout=60)
    # Assert: the event is set once the lock is free, the callback saw the signal, and the
    # previous handler (the default) is back after the block
    assert done is not None, "the process hung"
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["set ['SIGTERM']", "True"]


def test_setting_the_event_in_the_handler_itself_hangs_in_that_window() -> None:
    # The failure the relay avoids, shown on the same script (so that the test above would
    # catch its return); it takes under a second when it does not hang
    assert run_script("direct", timeout=5) is None


def test_without_an_event_the_block_gets_a_new_one_that_a_signal_sets() -> None:
    # Execute
    with set_on_signals(signals=(signal.SIGUSR1,)) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        was_set = stop.wait(5.0)
    # Assert
    assert isinstance(stop, threading.Event) and was_set
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
