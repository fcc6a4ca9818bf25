"""Device agents on one machine (``fedstream demo``, the benchmarks): one ``fedstream agent``
per device, their sockets in a private temporary directory (a Unix socket's path is limited
to about 107 bytes, which a run directory can exceed)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from deploy.local import ProcessGroup, fedstream_command, wait_until

__all__ = ["AGENT_START_S", "agent_sockets", "start_agents"]

#: How long an agent may take to load torch and listen (a loaded 2-core machine: seconds).
AGENT_START_S = 60.0


@contextlib.contextmanager
def agent_sockets(enabled: bool = True) -> Iterator[Path | None]:
    """A directory for the agents' sockets, private to this user (0700), removed after;
    None when agents are off."""
    if not enabled:
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix="fedstream-agents-"))  # mkdtemp: mode 0700
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def start_agents(
    group: ProcessGroup, buffers: dict[str, Path], sockets: Path, logs: Path | None = None
) -> dict[str, Path]:
    """Start ``fedstream agent`` for each device of ``buffers``; return each one's socket
    once all of them listen.

    Raises
    ------
    RuntimeError
        If an agent exits or does not listen within :data:`AGENT_START_S` (the message
        holds its log).
    """
    paths: dict[str, Path] = {}
    for dev, buffer in buffers.items():
        log = (logs or buffer.parent.parent / "logs") / f"agent-{dev}.log"
        paths[dev] = sockets / f"{dev}.sock"
        group.start(
            f"agent-{dev}",
            fedstream_command("agent", "--socket", str(paths[dev]), "--device-id", dev),
            log_path=log,
        )

    def listening() -> bool:
        dead = [n for n in (f"agent-{d}" for d in paths) if group.procs[n].poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited: {_tail(logs, buffers, dead)}")
        return all(_answers(p) for p in paths.values())

    if not wait_until(listening, AGENT_START_S, interval=0.1):
        raise RuntimeError(f"device agents did not listen within {AGENT_START_S:.0f} s")
    return paths


def _answers(path: Path) -> bool:
    """Whether an agent accepts connections at ``path`` (a killed one leaves its file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _tail(logs: Path | None, buffers: dict[str, Path], names: list[str]) -> str:
    """The last lines of the named agents' logs."""
    out = []
    for name in names:
        dev = name.removeprefix("agent-")
        log = (logs or buffers[dev].parent.parent / "logs") / f"agent-{dev}.log"
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        out.append(f"{name}: {' | '.join(text.strip().splitlines()[-3:])}")
    return "; ".join(out)
