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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any, NamedTuple, Self

from edge_client.runtime.constants import STOP_SIGNALS

__all__ = [
    "SIGNAL_ECHO_S",
    "ProcStat",
    "ProcessGroup",
    "StartStop",
    "Stopped",
    "descendants",
    "fedstream_command",
    "free_port",
    "pids",
    "proc_stat",
    "stop_on_signals",
    "stop_tree",
    "wait_for_port",
    "wait_until",
]

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


#: A process as seen in /proc: its pid and its start time (clock ticks after boot), so that a
#: pid reused by an unrelated process is never signalled.
ProcessId = tuple[int, int]


class StartStop:
    """Something started and stopped (a broker, a fleet view) as a context manager: entering
    calls ``start()`` (which returns it), leaving calls ``stop()``."""

    def start(self) -> Self:
        """Start it; return it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop it and release what it holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProcStat(NamedTuple):
    """What /proc says of one process: its state (``Z``: a zombie), parent and start time."""

    state: str
    ppid: int
    start: int


def proc_stat(pid: int | str) -> ProcStat | None:
    """``/proc/PID/stat``'s state, parent pid and start time; None if there is no such
    process (or no /proc: not Linux)."""
    try:
        # "pid (comm) state ppid ... starttime": comm may hold spaces and parentheses
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:  # gone meanwhile
        return None
    return ProcStat(fields[0], int(fields[1]), int(fields[19]))


def pids() -> list[int]:
    """Every pid /proc shows (none off Linux)."""
    root = Path("/proc")
    return [int(e.name) for e in root.iterdir() if e.name.isdigit()] if root.is_dir() else []


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every running process /proc shows (empty off
    Linux). Zombies are left out: they have ended, only their exit status waits to be read
    (by a parent, or by a PID 1 that may never read it in a container)."""
    table: dict[int, tuple[int, int]] = {}
    for pid in pids():
        stat = proc_stat(pid)
        if stat is not None and stat.state != "Z":
            table[pid] = (stat.ppid, stat.start)
    return table


def descendants(pid: int) -> list[ProcessId]:
    """Every living descendant of ``pid``, parents before their children (Linux; empty
    elsewhere). Processes that left their parent's process group or session are included:
    Flower's SuperLink runs its ServerApp in a group of its own."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: list[ProcessId] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop(0)
        found.append((child, table[child][1]))
        todo.extend(children.get(child, ()))
    return found


def _alive(pids: Sequence[ProcessId]) -> list[ProcessId]:
    table = _proc_table()
    return [(pid, start) for pid, start in pids if table.get(pid, (0, -1))[1] == start]


def _signal_all(pids: Sequence[ProcessId], sig: int) -> None:
    for pid, _ in _alive(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_tree(pid: int, grace: float, sig: int = signal.SIGTERM) -> list[int]:
    """Stop ``pid``'s descendants (not ``pid`` itself): ``sig`` to each, then SIGKILL to those
    still running after ``grace`` seconds. Returns the pids that needed SIGKILL.

    For processes that are not our children (or that our children started): the caller
    waits for its own children itself.
    """
    tree = descendants(pid)
    _signal_all(tree, sig)
    wait_until(lambda: not _alive(tree), grace, interval=0.1)
    stubborn = _alive([*tree, *descendants(pid)])
    _signal_all(stubborn, signal.SIGKILL)
    return [p for p, _ in stubborn]


#: A second stop signal this soon after the first is the same stop, not a second one: a user
#: presses Ctrl-C again seconds later, ``timeout`` signals the command and its process group.
SIGNAL_ECHO_S = 1.0

#: Processes a ProcessGroup is stopping right now: a second signal kills them at once.
_stopping: set[ProcessId] = set()


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by :func:`stop_on_signals` when a stop signal arrives, so
    that every ``with`` block on the way out stops what it started. A KeyboardInterrupt:
    code that lets Ctrl-C through lets this through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's code for a death by this signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals(say: Callable[[str], None]) -> Iterator[None]:
    """Turn the first SIGTERM, SIGINT or SIGHUP into :class:`Stopped` (the children are
    stopped on the way out: SIGTERM, then SIGKILL after a grace period), and a second one
    into SIGKILL for every process this one started, then exit at once.

    The handlers are installed whatever the signals' inherited disposition: a command started
    in the background by a non-interactive shell inherits SIGINT ignored, and Python's own
    Ctrl-C handling is then off.

    Parameters
    ----------
    say : callable
        Shows one line to the user (what was received, what happens now).
    """
    received: list[float] = []

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if received and time.monotonic() - received[0] < SIGNAL_ECHO_S:
            return  # the same stop, sent twice (timeout(1) signals us and our group)
        if received:
            doomed = _alive([*descendants(os.getpid()), *_stopping])
            say(f"{name} again: killing {len(doomed)} processes now (SIGKILL)")
            _signal_all(doomed, signal.SIGKILL)
            os._exit(128 + signum)
        received.append(time.monotonic())
        running = len(descendants(os.getpid()))
        say(
            f"{name}: stopping the {running} processes started here (SIGTERM, then SIGKILL "
            f"after {ProcessGroup.GRACE_S:g} s; {name} again kills them now)"
            if running
            else f"{name}: stopping"
        )
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ProcessGroup:
    """Children started together and stopped together, by pid, whatever happens.

    Use as a context manager; on exit every child still running, and everything it started
    (found in /proc, whatever process group it moved to), gets SIGTERM, then SIGKILL after
    ``grace`` seconds.
    """

    #: Default seconds between SIGTERM and SIGKILL: a stopped command is gone within 10 s.
    GRACE_S = 8.0
    #: Seconds the processes a child started get once the child itself has ended.
    ORPHAN_GRACE_S = 2.0

    def __init__(self, grace: float = GRACE_S) -> None:
        self.grace = grace
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self._started: dict[str, dict[str, Any]] = {}  # name -> how it was started
        self._born: dict[int, int | None] = {}  # pid -> its start time (clock ticks)

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
        self._started[name] = {
            "cmd": list(cmd),
            "log_path": log_path,
            "env": env,
            "stdout_pipe": stdout_pipe,
            "cwd": cwd,
        }
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
        started = proc_stat(proc.pid)  # its start time tells it from a later holder of its pid
        self._born[proc.pid] = None if started is None else started.start
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
        return proc

    def stop(self, name: str, timeout: float | None = None) -> int | None:
        """SIGTERM one child, SIGKILL it after the grace period; return its exit code."""
        proc = self.procs.pop(name)
        grace = self.grace if timeout is None else timeout
        tree = descendants(proc.pid)
        _signal_all(tree, signal.SIGTERM)
        code = _terminate(proc, grace, self._born.pop(proc.pid, None))
        wait_until(lambda: not _alive(tree), min(grace, 2.0), 0.1)
        _signal_all(tree, signal.SIGKILL)  # what it started and left behind
        return code

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start child ``name`` again as it was started last (after :meth:`kill` or
        :meth:`stop`: as systemd restarts a unit), its log appended to."""
        if name in self.procs:
            raise ValueError(f"{name} is running")
        return self.start(name, **self._started[name])

    def kill(self, name: str) -> None:
        """SIGKILL one child and everything it started (for crash tests), and reap it."""
        proc = self.procs.pop(name)
        tree = descendants(proc.pid)
        _signal_group(proc, signal.SIGKILL, self._born.pop(proc.pid, None))
        _signal_all(tree, signal.SIGKILL)
        proc.wait()

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stop every child still running and what it started: ``sig`` to all first (to each
        child's process group and every descendant), one grace period for all, then
        SIGKILL to whatever is left."""
        procs = list(self.procs.values())
        self.procs.clear()
        trees = {proc.pid: descendants(proc.pid) for proc in procs}
        tracked = {p for tree in trees.values() for p in tree}
        _stopping.update(tracked)  # where a second signal finds them, whatever their parent
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, sig, self._born.get(proc.pid))
            _signal_all(trees[proc.pid], sig)
        deadline = time.monotonic() + self.grace  # one grace period for all, not each
        for proc in procs:
            _terminate(proc, max(0.1, deadline - time.monotonic()), self._born.pop(proc.pid, None))
        # What a child started and outlives it gets a little longer, not the whole grace: its
        # parent, which would have told it how to end, is gone (Flower's ServerApp, asked
        # to stop, waits for its round to end; its SuperLink and SuperNodes are gone).
        orphans = [p for tree in trees.values() for p in tree]
        limit = min(deadline - time.monotonic(), self.ORPHAN_GRACE_S)
        wait_until(lambda: not _alive(orphans), max(0.1, limit), 0.1)
        for pid, _ in _alive(orphans):
            log.warning("pid %d (started by a child) still running after SIGTERM; killing it", pid)
        _signal_all(orphans, signal.SIGKILL)  # what a child started and left behind
        _stopping.difference_update(tracked)
        for fh in self._logs:
            fh.close()
        self._logs.clear()

    def kill_all(self) -> None:
        """SIGKILL every child and what it started, at once (a second Ctrl-C)."""
        self.grace = 0.0
        self.close(signal.SIGKILL)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int, born: int | None) -> None:
    """Signal the child's whole process group (it leads one: start_new_session).

    Once the child is reaped its pid is free, and the group's number with it when no member
    is left: another session's leader may hold it by now (pids wrap at 32768 on many hosts),
    which a plain ``killpg`` would signal. The group is signalled only while no other process
    holds the child's pid (a living member keeps the number from being reused); ``born`` is
    the child's start time."""
    now = proc_stat(proc.pid)
    if now is not None and born is not None and now.start != born:
        return  # the pid is another process's now: the group ended with its last member
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _terminate(proc: subprocess.Popen[bytes], grace: float, born: int | None) -> int | None:
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM, born)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("pid %d still running after SIGTERM; killing it", proc.pid)
            _signal_group(proc, signal.SIGKILL, born)
            proc.wait()
    _signal_group(proc, signal.SIGKILL, born)  # stragglers it left in its group
    return proc.returncode
