"""The one module that leans on Flower's internals: pinned, and its pacing by hand."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from edge_client import flower_internals as fi
from edge_client.runtime.task_taker import read_secret
from edge_client.task_wake import WakeSocket, send_wake, wake_path


def test_the_flower_internals_relied_on_are_those_pinned() -> None:
    # Execute: hash the source of every Flower function the device runtime relies on.
    changed = fi.changed_internals()
    # Assert: a Flower release that changes one fails here (read it again, then re-pin).
    assert changed == {}, (
        "Flower changed what edge_client/flower_internals.py relies on: read the "
        f"new sources, adapt, and update PINNED: {changed}"
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pacer_pulls_fast_in_a_run_and_at_flowers_pace_when_idle() -> None:
    # Prepare: a node that has just joined.
    clock, slept = _Clock(), list[float]()
    pacer = fi.Pacer(clock=clock, sleep=slept.append)
    # Execute / Assert: before its first message it pulls at Flower's pace ...
    pacer.sleep(3)
    assert slept[-1] == 3
    # ... an empty pull right after a message waits FAST_PULL_S ...
    pacer.busy()
    pacer.sleep(3)
    assert slept[-1] == fi.FAST_PULL_S
    # ... and once the node has been idle past HOT_S, Flower's own 3 s.
    clock.now += fi.HOT_S + 1
    pacer.sleep(3)
    assert slept[-1] == 3
    # Waiting for a reply looks every REPLY_POLL_S and makes the node busy again.
    pacer.sleep(0.5)
    assert slept[-1] == fi.REPLY_POLL_S
    pacer.sleep(3)
    assert slept[-1] == fi.FAST_PULL_S
    # Everything else is the real time module.
    assert pacer.time() > 0 and pacer.monotonic() > 0


def test_installing_the_pacer_changes_only_the_supernode_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: restore Flower's module afterwards.
    import time

    import flwr.supernode.start_client_internal as module

    for name in ("time", "_push_messages", "_pull_and_store_message", "pull_objects"):
        monkeypatch.setattr(module, name, getattr(module, name))
    # Execute
    pacer = fi.install_pacer(fi.Pacer())
    # Assert: the SuperNode's loop sees the pacer; the process's time module is untouched.
    assert getattr(module, "time") is pacer and time.sleep is not pacer.sleep  # noqa: B009
    assert getattr(module, "pull_objects").keywords == {  # noqa: B009
        "initial_backoff": fi.OBJECT_RETRY_S[0],
        "backoff_cap": fi.OBJECT_RETRY_S[1],
        "max_tries_per_object": None,
    }


def test_the_serverapp_asks_again_for_a_replys_objects_within_a_tenth_of_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: restore Flower's grid module afterwards; an object that is not there at the
    # first ask (the SuperNode pushes a reply's message before its objects).
    import flwr.superlink.grid.http_grid as grid_module
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    monkeypatch.setattr(grid_module, "pull_objects", getattr(grid_module, "pull_objects"))  # noqa: B009
    asked: list[float] = []

    def pull_object(object_id: str) -> bytes:
        asked.append(time.monotonic())
        if len(asked) == 1:
            raise ObjectUnavailableError(object_id)
        return b"content"

    # Execute: twice (the second changes nothing), then pull as HttpGrid.pull_messages does.
    fi.quicken_reply_pulls()
    fi.quicken_reply_pulls()
    patched = getattr(grid_module, "pull_objects")  # noqa: B009
    pulled = patched(["a"], pull_object)
    # Assert: asked again after OBJECT_RETRY_S (Flower's own first retry: 0.8-1.2 s later).
    assert patched.keywords == {
        "initial_backoff": fi.OBJECT_RETRY_S[0],
        "backoff_cap": fi.OBJECT_RETRY_S[1],
        "max_tries_per_object": None,
    }
    assert not isinstance(patched.func, type(patched))
    assert pulled == {"a": b"content"} and len(asked) == 2
    assert asked[1] - asked[0] < 0.5


def test_the_superexec_secret_must_be_private_and_not_empty(tmp_path: Path) -> None:
    # Prepare
    secret = tmp_path / "dev-0.secret"
    secret.write_text("s3cret\n")
    # Execute / Assert: others may read it: refused, with the fix.
    os.chmod(secret, 0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        read_secret(secret)
    os.chmod(secret, 0o600)
    assert read_secret(secret) == b"s3cret\n"  # byte for byte as the SuperNode reads it
    secret.write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_secret(secret)


def test_the_supernode_wakes_its_agent_when_a_message_is_stored_and_only_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: Flower's pull-and-store as a fake that stores a message of run 7, then none;
    # the agent's wake socket beside the secret file
    import flwr.supernode.start_client_internal as module

    for name in ("time", "_push_messages", "_pull_and_store_message", "pull_objects"):
        monkeypatch.setattr(module, name, getattr(module, name))
    pulled = iter([7, None])
    monkeypatch.setattr(module, "_pull_and_store_message", lambda **_: next(pulled))
    listening = WakeSocket(wake_path(tmp_path / "dev-0.secret"))
    try:
        fi.install_pacer(fi.Pacer(), wake=listening.path)
        # Execute / Assert: a stored message wakes the agent at once; an empty pull does not
        pull_and_store = getattr(module, "_pull_and_store_message")  # noqa: B009
        assert pull_and_store(state=None) == 7
        assert listening.wait(5.0) and listening.woken
        assert pull_and_store(state=None) is None
        assert not listening.wait(0.05)
    finally:
        listening.close()
    assert not listening.path.exists()


def _stored(state: Any, store: Any, run_id: int, reply_to: str = "") -> str:
    """Store a message of ``run_id`` (a reply when ``reply_to``) as the SuperNode does."""
    import flwr.supernode.start_client_internal as module
    from flwr.app import ConfigRecord, RecordDict
    from flwr.app.message.message import make_message
    from flwr.app.metadata import Metadata

    node, server = (0, 5) if reply_to else (5, 0)
    metadata = Metadata(
        run_id=run_id,
        message_id="",
        src_node_id=server,
        dst_node_id=node,
        reply_to_message_id=reply_to,
        group_id="3",
        created_at=time.time(),
        ttl=3600.0,
        message_type="train",
    )
    message = make_message(metadata, RecordDict({"c": ConfigRecord({"run": run_id})}))
    module._insert_message(message, state, store)
    return str(message.metadata.message_id)


def test_a_reply_left_waiting_by_the_pull_loop_is_pushed_before_the_next_pull(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: Flower's own node state holding a stale message (a killed run's, stored
    # without a pull that pairs it) and the agent's error reply to it; the next pull stores
    # the new run's message. The loop is driven by hand: pull, push, (reply), pull.
    import flwr.supernode.start_client_internal as module
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    for name in ("time", "_push_messages", "_pull_and_store_message", "pull_objects"):
        monkeypatch.setattr(module, name, getattr(module, name))
    store = ObjectStoreFactory().store()
    state = InMemoryNodeState(store)
    stale = _stored(state, store, run_id=1)
    stale_reply = _stored(state, store, run_id=1, reply_to=stale)
    pulled: list[str] = []
    pulls = iter([2, None])

    def pull(**_: Any) -> int | None:
        run_id = next(pulls)
        if run_id is not None:
            pulled.append(_stored(state, store, run_id))
        return run_id

    monkeypatch.setattr(module, "_pull_and_store_message", pull)
    sent: list[str] = []

    def send(message: Any, tree: Any, runtime: float) -> tuple[set[str], str]:
        sent.append(message.metadata.message_id)
        return set(), "session"

    fi.install_pacer(fi.Pacer(sleep=lambda _: None))
    loop_pull = getattr(module, "_pull_and_store_message")  # noqa: B009
    loop_push = getattr(module, "_push_messages")  # noqa: B009
    connection = {"state": state, "object_store": store}
    # Execute: the new run's message is pulled; its push finds the stale reply first.
    assert loop_pull(**connection) == 2
    loop_push(**connection, send=send, push_object=lambda *_: None)
    assert sent == [stale_reply]
    reply = _stored(state, store, run_id=2, reply_to=pulled[0])  # the agent answers
    assert loop_pull(**connection) is None  # nothing new on the SuperLink
    # Assert: the new run's reply went before that pull, not with the next message's push
    # (a round's timeout later); nothing is left in the state.
    assert sent == [stale_reply, reply]
    assert list(state.get_messages_legacy()) == []


def test_the_wake_socket_is_private_replaces_a_stale_one_and_refuses_a_long_path(
    tmp_path: Path,
) -> None:
    # Prepare: a socket file left by a killed agent
    path = wake_path(tmp_path / "dev-0.secret")
    assert path.name == "dev-0.secret.wake"
    first = WakeSocket(path)
    first._sock.close()  # killed: the file stays
    # Execute
    second = WakeSocket(path)
    try:
        # Assert: bound again, the owner's only; a wake with nobody listening is not an error
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert send_wake(path) and second.wait(5.0)
        assert not send_wake(tmp_path / "nobody.wake")
    finally:
        second.close()
    with pytest.raises(OSError, match="too long for a Unix socket"):
        WakeSocket(tmp_path / ("x" * 120))
