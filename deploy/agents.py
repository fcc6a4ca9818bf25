"""Device agents on one machine (``fedstream demo``, the benchmarks): one ``fedstream agent``
per device, their sockets in a private temporary directory (a Unix socket's path is limited
to about 107 bytes, which a run directory can exceed), beside them each device's SuperExec
secret when the agents take their SuperNodes' tasks themselves."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.local import ProcessGroup, fedstream_command, free_port, wait_until
from edge_client.runtime.task_taker import write_private

if TYPE_CHECKING:
    from deploy.flower import FlowerDeployment

__all__ = ["AGENT_START_S", "agent_sockets", "start_agents", "start_devices", "task_secret"]

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


def task_secret(sockets: Path, device: str) -> Path:
    """A fresh SuperExec secret for ``device``'s SuperNode and agent, in a file only this
    user reads (0600, in the agents' private directory); its path."""
    path = sockets / f"{device}.secret"
    # With a newline, as `openssl rand -hex 32 > FILE` writes one (the deployment guide's
    # way): the SuperNode keeps it, and so must the agent.
    write_private(path, secrets.token_hex(32) + "\n")
    return path


def start_agents(
    group: ProcessGroup,
    buffers: dict[str, Path],
    sockets: Path,
    logs: Path | None = None,
    tasks: dict[str, tuple[int, Path]] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Path]:
    """Start ``fedstream agent`` for each device of ``buffers``; return each one's socket
    once all of them listen.

    ``tasks`` (device -> its SuperNode's runtime API port and SuperExec secret): the agents
    take their SuperNodes' tasks themselves (no ClientApp process per message), in ``env``
    (the deployment's Flower home, where they install the run's app).

    Raises
    ------
    RuntimeError
        If an agent exits or does not listen within :data:`AGENT_START_S` (the message
        holds its log).
    """
    paths: dict[str, Path] = {}
    # Only a socket bound by the new agents counts: a killed agent's file, or a listener that
    # outlived its agent, is not the new agent (which refuses to take over a live one).
    stale: dict[Path, tuple[int, int] | None] = {}
    for dev, buffer in buffers.items():
        log = (logs or buffer.parent.parent / "logs") / f"agent-{dev}.log"
        paths[dev] = sockets / f"{dev}.sock"
        stale[paths[dev]] = _identity(paths[dev])
        taking: list[str] = []
        if tasks is not None:
            port, secret = tasks[dev]
            taking = [
                "--runtime-api",
                f"127.0.0.1:{port}",
                "--superexec-auth-secret-file",
                str(secret),
            ]
        group.start(
            f"agent-{dev}",
            fedstream_command("agent", "--socket", str(paths[dev]), "--device-id", dev, *taking),
            log_path=log,
            env=env,
        )

    def listening() -> bool:
        dead = [n for n in (f"agent-{d}" for d in paths) if group.procs[n].poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited: {_tail(logs, buffers, dead)}")
        return all(_identity(p) != stale[p] and _answers(p) for p in paths.values())

    if not wait_until(listening, AGENT_START_S, interval=0.1):
        raise RuntimeError(f"device agents did not listen within {AGENT_START_S:.0f} s")
    return paths


def start_devices(
    flower: FlowerDeployment,
    buffers: dict[str, Path],
    node_config: Callable[[str, str], Mapping[str, Any]],
    sockets: Path | None,
    logs: Path | None = None,
    take_tasks: bool = True,
) -> bool:
    """Start each device of ``buffers``: its agent (with ``sockets``, the agents' private
    directory) and its SuperNode, whose node config is ``node_config(device, agent)``
    (``agent``: the socket the ClientApps hand over to, or ``""``).

    ``take_tasks`` (the default): each agent takes its SuperNode's tasks itself (the node
    runs ``--isolation process`` and starts no ClientApp process); else each message's
    ClientApp process hands over through the agent's socket. Returns whether the agents
    take the tasks.
    """
    tasks = None
    if sockets is not None and take_tasks:
        tasks = {dev: (free_port(), task_secret(sockets, dev)) for dev in buffers}
    agents = (
        start_agents(flower.group, buffers, sockets, logs, tasks=tasks, env=flower.env)
        if sockets is not None
        else {}
    )
    for dev in buffers:
        task = tasks[dev] if tasks is not None else None
        flower.start_supernode(
            dev,
            node_config(dev, "" if task else str(agents.get(dev, ""))),
            tasks_secret=task[1] if task else None,
            runtime_port=task[0] if task else None,
        )
    return tasks is not None


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (its inode and modification time), None when there is none."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_mtime_ns


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
