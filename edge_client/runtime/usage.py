"""What a process costs its device: age, CPU time, peak memory and bytes written to storage.

Read from Linux's ``/proc`` (and :mod:`resource`), so that a ClientApp can report its own
cost with its reply and a benchmark can read the long-lived processes (ingest daemon,
SuperNode) from outside. Where ``/proc`` is missing (macOS, Windows) the figures are 0:
they describe the device, they never decide anything.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

__all__ = [
    "children",
    "cpu_s",
    "disk_write_bytes",
    "parent",
    "peak_rss_bytes",
    "process_age_s",
    "pss_bytes",
]

_PROC = Path("/proc")
# Linux reports ru_maxrss in KiB, macOS in bytes.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (which may hold spaces): field 3 first."""
    text = (_PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def process_age_s(pid: int | None = None) -> float:
    """Seconds since the process started (0 where ``/proc`` is missing).

    Linux counts the start in clock ticks since boot (10 ms on most kernels), so the
    figure is that coarse.
    """
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        started = int(_stat_fields(pid or os.getpid())[19]) / ticks  # field 22: starttime
        uptime = float((_PROC / "uptime").read_text().split()[0])  # the same clock, 10 ms
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started)


def cpu_s(pid: int | None = None, *, reaped: bool = True) -> float:
    """CPU seconds (user + system) of the process; ``reaped``: with its children that have
    exited and been waited for (Linux adds theirs to the parent's).

    Without ``pid``: this process, from :mod:`resource` (any POSIX system).
    """
    if pid is None or pid == os.getpid():
        own = resource.getrusage(resource.RUSAGE_SELF)
        total = own.ru_utime + own.ru_stime
        if reaped:
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            total += kids.ru_utime + kids.ru_stime
        return float(total)
    try:
        fields = _stat_fields(pid)
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0
    used = fields[11:15] if reaped else fields[11:13]  # utime stime [cutime cstime]
    return sum(int(f) for f in used) / ticks


def peak_rss_bytes(pid: int | None = None) -> int:
    """The process's peak resident memory in bytes (``VmHWM``; 0 when unknown)."""
    if pid is None or pid == os.getpid():
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _MAXRSS_UNIT
    return _kib_field(pid, "status", "VmHWM:")


def rss_bytes(pid: int) -> int:
    """The process's resident memory now, in bytes (``VmRSS``; 0 when unknown)."""
    return _kib_field(pid, "status", "VmRSS:")


def maps_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (it imported torch; False when
    unknown)."""
    try:
        return "libtorch" in (_PROC / str(pid) / "maps").read_text()
    except OSError:
        return False


def pss_bytes(pid: int) -> int:
    """The process's proportional set size in bytes: its resident memory with each page
    shared with other processes (the interpreter, torch's libraries) divided among them, so
    that the figures of processes running together add up (0 when unknown)."""
    return _kib_field(pid, "smaps_rollup", "Pss:")


def _kib_field(pid: int, name: str, key: str) -> int:
    """The field ``key`` (in kB) of the process's ``/proc/PID/<name>``, in bytes (0 when
    unknown: the process is gone, or the kernel has no such file)."""
    try:
        for line in (_PROC / str(pid) / name).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def disk_write_bytes(pid: int | None = None) -> int:
    """Bytes the process has sent to storage so far (``write_bytes`` of ``/proc/PID/io``,
    counted when pages are dirtied: SQLite's WAL and checkpoints, logs; not pipes or
    sockets). 0 when unknown."""
    try:
        text = (_PROC / str(pid or os.getpid()) / "io").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def parent(pid: int) -> int:
    """The parent's pid (0 when unknown)."""
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return 0


def children(pid: int) -> list[int]:
    """The live descendants of ``pid`` (children, their children, ...), from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for entry in _PROC.glob("[0-9]*"):
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found
