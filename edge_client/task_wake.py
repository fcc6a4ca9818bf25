"""A SuperNode telling its device's agent that a task is ready, so that the agent need not
poll for it.

Flower's runtime API has no notification: a process taking a SuperNode's tasks asks for one
(``AcquireTask``) until there is one. fedstream's SuperNode launcher
(:func:`~edge_client.flower_internals.supernode_main`) sends one datagram to a Unix
socket beside its SuperExec secret file (:func:`wake_path`) each time it has stored a
message with its objects; the agent (:class:`~edge_client.runtime.task_taker.TaskTaker`)
listens there and asks at once, and otherwise only every
:data:`~edge_client.runtime.task_taker.IDLE_POLL_S`. The datagram carries nothing: a
process that sends one can only make the agent ask once more (what it does anyway), and
one that is lost (no agent listening, a full queue) costs the agent's next poll.

With plain ``flower-supernode``, or where the socket cannot be made (a path too long for a
Unix socket, a platform without them), no wake comes and the agent polls as before.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from pathlib import Path
from typing import Final

__all__ = ["MAX_SOCKET_PATH", "WAKE_SUFFIX", "WakeSocket", "send_wake", "wake_path"]

log = logging.getLogger(__name__)

#: The wake socket's name: the SuperExec secret file's, with this added.
WAKE_SUFFIX = ".wake"
#: The longest path a Unix socket may have (sun_path is 108 bytes with its NUL on Linux).
MAX_SOCKET_PATH: Final = 107


def wake_path(secret_file: str | os.PathLike[str]) -> Path:
    """The wake socket of the SuperNode whose SuperExec secret is ``secret_file`` (in the
    same, private directory: the device's state directory under the deployment units)."""
    path = Path(secret_file)
    return path.with_name(path.name + WAKE_SUFFIX)


def send_wake(path: Path) -> bool:
    """One datagram to the agent listening at ``path``; False when none is (it polls)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(b"\x01", str(path))
    except OSError:  # no socket there, nobody bound to it, a full queue
        return False
    return True


class WakeSocket:
    """The agent's end: a datagram socket at ``path`` (mode 0600), waited on.

    Parameters
    ----------
    path : Path
        Where to bind (:func:`wake_path`); a stale socket there (an agent that was killed)
        is replaced.

    Raises
    ------
    OSError
        If the socket cannot be made there (the path too long, a directory not writable).
    """

    def __init__(self, path: Path) -> None:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise OSError(f"{path} is too long for a Unix socket ({MAX_SOCKET_PATH} bytes)")
        self.path = path
        self.woken = False  # a wake has come at least once: the SuperNode sends them
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            path.unlink(missing_ok=True)
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for a wake; True when one came (every datagram
        waiting is read: one ask answers them all)."""
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                break
        self.woken = True
        return True

    def poke(self) -> None:
        """Wake the waiter now (to stop)."""
        send_wake(self.path)

    def close(self) -> None:
        """Close the socket and remove its file."""
        self._sock.close()
        self.path.unlink(missing_ok=True)
