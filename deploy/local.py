"""Local process supervision for the launcher and the tests: ports, children, clean-up."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

__all__ = ["ProcessGroup", "fedstream_command", "free_port", "wait_for_port", "wait_until"]

log = logging.getLogger(__name__)


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``pred`` until true or ``timeout`` seconds (bounded loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> bool:
    """Poll until something accepts connections on ``host:port``; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def fedstream_command(*args: str) -> list[str]:
    """Command line that runs ``fedstream ARGS`` with this interpreter (no PATH needed)."""
    return [sys.executable, "-m", "deploy", *args]


class ProcessGroup:
    """Children started together and stopped together, by pid, whatever happens.

    Use as a context manager; on exit every child still running gets SIGTERM, then SIGKILL
    after ``grace`` seconds.
    """

    def __init__(self, grace: float = 10.0) -> None:
        self.grace = grace
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = False,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` as child ``name``; stderr (and stdout) go to ``log_path`` if given."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            fh = log_path.open("ab")
            self._logs.append(fh)
            out = fh
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE if stdout_pipe else out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            # Own process group: stopping a child stops what it started (Flower's SuperLink
            # and SuperNodes spawn superexec and app processes), and Ctrl-C reaches only us.
            start_new_session=True,
        )
        self.procs[name] = proc
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
        return proc

    def stop(self, name: str, timeout: float | None = None) -> int | None:
        """SIGTERM one child, SIGKILL it after the grace period; return its exit code."""
        proc = self.procs.pop(name)
        return _terminate(proc, self.grace if timeout is None else timeout)

    def kill(self, name: str) -> None:
        """SIGKILL one child and everything it started (for crash tests), and reap it."""
        proc = self.procs.pop(name)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        """Stop every child still running (SIGTERM all first, then wait, then SIGKILL)."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace  # one grace period for all, not each
        for proc in procs:
            _terminate(proc, max(0.1, deadline - time.monotonic()))
        for fh in self._logs:
            fh.close()
        self._logs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's whole process group (it leads one: start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("pid %d still running after SIGTERM; killing it", proc.pid)
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    _signal_group(proc, signal.SIGKILL)  # stragglers it left in its group
    return proc.returncode
