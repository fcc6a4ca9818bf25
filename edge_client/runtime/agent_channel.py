"""The local channel between the ClientApp and the device's agent: a Unix socket only the
device's user can open, one request and one reply per connection.

A request is a Flower message with what the agent needs of its context (run, node config,
run config) and of the app (the task's import path, the directory the app was installed
into); a reply is the message the ClientApp returns, or an error the agent describes. Both
travel as one frame: a fixed header (magic, protocol, length), a JSON head, then the
message in Flower's own protobuf serialisation (:mod:`flwr.common.serde`), so the wire
format of the replies is the one a ClientApp without an agent sends.

This module imports neither torch nor the task: it is what the ClientApp process loads.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage

from edge_client.runtime.constants import AGENT_MAX_FRAME_BYTES, AGENT_PROTOCOL

__all__ = [
    "AgentError",
    "AgentReply",
    "AgentRequest",
    "fedstream_version",
    "read_frame",
    "send_request",
    "socket_dir_ok",
    "write_frame",
]

_MAGIC = b"FSAG"
_HEADER = struct.Struct("!4sBQ")  # magic, protocol, length of what follows
_HEAD_LEN = struct.Struct("!I")


class AgentError(RuntimeError):
    """The agent cannot be reached, died mid-message, refused the request or sent
    something that is not a reply."""


@cache
def fedstream_version() -> str:
    """The installed fedstream's version (an agent of another version is refused)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedstream")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown"


@dataclass(frozen=True)
class AgentRequest:
    """What the ClientApp hands the agent for one message.

    Attributes
    ----------
    kind : {"train", "query"}
        Which handler: a round, or the timing probe.
    message : Message
        Flower's message as the ClientApp received it.
    run_id : int
        The run (the agent loads each run's code afresh).
    node_config, run_config : mapping
        ``context.node_config`` and ``context.run_config``.
    task : str, optional
        The task's import path the app was built around (None: the run config names it).
    app_dir : str, optional
        Where the app's package was installed for this run (on the agent's import path for
        this run's code only).
    version : str
        The ClientApp's fedstream version.
    """

    kind: str
    message: Message
    run_id: int
    node_config: Mapping[str, Any]
    run_config: Mapping[str, Any]
    task: str | None = None
    app_dir: str | None = None
    version: str = ""

    def head(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "run-id": self.run_id,
            "node-config": dict(self.node_config),
            "run-config": dict(self.run_config),
            "task": self.task,
            "app-dir": self.app_dir,
            "version": self.version or fedstream_version(),
        }

    def to_bytes(self) -> bytes:
        return _pack(self.head(), self.message)

    @classmethod
    def from_bytes(cls, data: bytes) -> AgentRequest:
        """Raises :class:`AgentError` when ``data`` is not a request."""
        head, message = _unpack(data)
        if message is None:
            raise AgentError("a request without its message")
        try:
            return cls(
                kind=str(head["kind"]),
                message=message,
                run_id=int(head["run-id"]),
                node_config=dict(head["node-config"]),
                run_config=dict(head["run-config"]),
                task=head.get("task"),
                app_dir=head.get("app-dir"),
                version=str(head.get("version", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise AgentError(f"a malformed request head ({err!r})") from err


@dataclass(frozen=True)
class AgentReply:
    """The agent's answer: the reply message, or why there is none."""

    message: Message | None = None
    error: str | None = None
    version: str = ""

    def to_bytes(self) -> bytes:
        head = {"error": self.error, "version": self.version or fedstream_version()}
        return _pack(head, self.message)

    @classmethod
    def from_bytes(cls, data: bytes) -> AgentReply:
        head, message = _unpack(data)
        error = head.get("error")
        if error is None and message is None:
            raise AgentError("a reply with neither a message nor an error")
        return cls(message, None if error is None else str(error), str(head.get("version", "")))


def _pack(head: dict[str, Any], message: Message | None) -> bytes:
    head_bytes = json.dumps(head).encode()
    body = b"" if message is None else message_to_proto(message).SerializeToString()
    return _HEAD_LEN.pack(len(head_bytes)) + head_bytes + body


def _unpack(data: bytes) -> tuple[dict[str, Any], Message | None]:
    try:
        (n,) = _HEAD_LEN.unpack_from(data)
        head = json.loads(data[_HEAD_LEN.size : _HEAD_LEN.size + n])
        body = data[_HEAD_LEN.size + n :]
        message = message_from_proto(ProtoMessage.FromString(body)) if body else None
    except Exception as err:  # struct, JSON or protobuf: whatever a corrupt frame raises
        raise AgentError(f"an unreadable frame ({type(err).__name__}: {err})") from err
    if not isinstance(head, dict):
        raise AgentError("an unreadable frame (its head is not a JSON object)")
    return head, message


def write_frame(sock: socket.socket, payload: bytes) -> None:
    """Send one frame: the fixed header, then ``payload``."""
    sock.sendall(_HEADER.pack(_MAGIC, AGENT_PROTOCOL, len(payload)) + payload)


def read_frame(sock: socket.socket, max_bytes: int = AGENT_MAX_FRAME_BYTES) -> bytes:
    """Receive one frame's payload.

    Raises
    ------
    AgentError
        If the peer closed before a whole frame, speaks another protocol, or announces more
        than ``max_bytes``.
    """
    magic, protocol, length = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if magic != _MAGIC:
        raise AgentError("the peer is not a fedstream agent (bad magic)")
    if protocol != AGENT_PROTOCOL:
        raise AgentError(
            f"the peer speaks agent protocol {protocol}, this fedstream {AGENT_PROTOCOL}: "
            "run the same fedstream version for the agent and the SuperNode"
        )
    if length > max_bytes:
        raise AgentError(f"a frame of {length} bytes announced; at most {max_bytes} taken")
    return _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise AgentError(f"the connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_request(path: str | Path, request: AgentRequest, timeout: float) -> AgentReply:
    """Hand ``request`` to the agent listening at ``path``; wait up to ``timeout`` seconds
    for its reply.

    Raises
    ------
    AgentError
        If no agent listens there, it closes the connection before replying (killed
        mid-message), takes longer than ``timeout`` or replies with something unreadable.
        The message names the socket.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(max(timeout, 1.0))
        try:
            sock.connect(str(path))
        except OSError as err:
            raise AgentError(
                f"no agent at {path} ({type(err).__name__}: {err.strerror or err}); start it "
                f"with `fedstream agent --socket {path}` (systemd: fedstream-agent@<device>)"
            ) from err
        try:
            write_frame(sock, request.to_bytes())
            return AgentReply.from_bytes(read_frame(sock))
        except TimeoutError as err:
            raise AgentError(f"the agent at {path} did not reply within {timeout:.0f} s") from err
        except AgentError as err:
            raise AgentError(f"the agent at {path} failed mid-message: {err}") from err
        except OSError as err:
            raise AgentError(f"the agent at {path} failed mid-message: {err}") from err


def socket_dir_ok(path: Path) -> None:
    """Make the socket's directory, private to this user (mode 0700), or refuse one that
    others can enter or that belongs to someone else.

    Raises
    ------
    PermissionError
        If the directory exists with group or other access, or another owner.
    """
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(
            f"{directory} must belong to this user and be private (chmod 700): the agent's "
            "socket trains on this device's data"
        )
