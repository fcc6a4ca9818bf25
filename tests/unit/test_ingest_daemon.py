"""Ingest daemon pieces that need no broker."""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edge_client.runtime.ingest import IngestConfig, IngestDaemon
from edge_client.runtime.ingest_status import RejectLog as _RejectLog
from edge_client.runtime.mqtt import BrokerURL


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[IngestDaemon]:
    """A daemon on a fresh buffer, never connected (its pieces are called directly)."""
    config = IngestConfig(BrokerURL.parse("mqtt://127.0.0.1:1"), "d", tmp_path / "d.sqlite")
    daemon = IngestDaemon(config)
    yield daemon
    daemon.store.close()


def test_rejects_are_logged_once_per_reason_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare
    log = _RejectLog(interval=60.0)
    caplog.set_level(logging.WARNING, logger="edge_client.runtime.ingest")
    # Execute: a flood of one reason, a new reason, then the first again after a minute.
    for t in range(50):
        log.record(Counter({"bad-magic": 3}), now=float(t))
    log.record(Counter({"non-finite": 1}), now=50.0)
    log.record(Counter({"bad-magic": 1}), now=61.0)
    # Assert
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "3 message(s) as bad-magic" in lines[0]
    assert "1 message(s) as non-finite" in lines[1]
    assert "148 message(s) as bad-magic" in lines[2]  # everything since the last line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_id": "a/b"}, "device id"),
        ({"status_interval": 0}, "status interval"),
        ({"commit_interval": 0}, "commit interval"),
        ({"commit_interval": 3600}, "commit interval"),
    ],
)
def test_config_is_validated(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "broker": BrokerURL.parse("mqtt://127.0.0.1:1"),
        "device_id": "d",
        "buffer": "b.sqlite",
    }
    with pytest.raises(ValueError, match=message):
        IngestConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_broker_urls() -> None:
    assert BrokerURL.parse("mqtts://h") == BrokerURL("h", 8883, True)
    assert BrokerURL.parse("127.0.0.1:1884") == BrokerURL("127.0.0.1", 1884, False)
    for bad in ("http://h:1", "mqtt://:1883", "mqtt://h:99999"):
        with pytest.raises(ValueError, match="broker URL"):
            BrokerURL.parse(bad)


def test_a_message_the_buffer_cannot_take_is_isolated_not_retried_forever(
    daemon: IngestDaemon, frames: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the store fails on one publisher's messages (a bug or a poison message).
    append = daemon.store.append

    def picky(arrivals: Any, **kw: Any) -> Any:
        if "poison" in getattr(arrivals, "publishers", []):
            raise ValueError("cannot store this")
        return append(arrivals, **kw)

    monkeypatch.setattr(daemon.store, "append", picky)
    items = [
        (1, 1, frames(n=4, publisher="good", seq=1), 0.0, "fedstream/v1/d/samples", False),
        (2, 1, frames(n=4, publisher="poison", seq=1), 0.0, "fedstream/v1/d/samples", False),
        (3, 1, frames(n=4, publisher="good", seq=2), 0.0, "fedstream/v1/d/samples", False),
    ]
    # Execute
    done = daemon._commit_each(items)
    # Assert: the good ones are in, the bad one is counted and acknowledged, nothing retried
    s = daemon.store.stats()
    assert done and s["accepted"] == 8 and s["rejected-by-reason"] == {"decode-error": 1}
    assert sorted(daemon._acks) == [(1, 1), (2, 1), (3, 1)]


def test_a_full_disk_holds_the_messages_for_a_retry(
    daemon: IngestDaemon, frames: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_a: Any, **_k: Any) -> Any:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(daemon.store, "append", full)

    done = daemon._commit_each(
        [(1, 1, frames(n=2, publisher="p", seq=1), 0.0, "fedstream/v1/d/samples", False)]
    )

    assert not done and not daemon._acks  # kept unacknowledged: retried when space returns


def test_acks_due_on_a_lost_connection_are_not_sent_on_the_next(
    daemon: IngestDaemon, frames: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: message id 7 arrives, the connection drops before its ack goes out, and on
    # the new connection the broker uses id 7 for a different message.
    sent: list[int] = []
    monkeypatch.setattr(daemon._client, "ack", lambda mid, qos: sent.append(mid))
    client = SimpleNamespace(subscribe=lambda *a, **k: (0, 1))  # (rc, mid)
    ok = SimpleNamespace(is_failure=False)

    def arrive(seq: int) -> None:
        msg = SimpleNamespace(
            mid=7, qos=1, payload=frames(n=1, publisher="p", seq=seq), topic="t", retain=False
        )
        daemon._on_message(client, None, msg)  # type: ignore[arg-type]

    daemon._on_connect(client, None, SimpleNamespace(session_present=False), ok, None)  # type: ignore[arg-type]
    arrive(0)
    old = daemon._drain()
    daemon._on_connect(client, None, SimpleNamespace(session_present=True), ok, None)  # type: ignore[arg-type]
    arrive(1)
    new = daemon._drain()
    # Execute: both are committed, then the acks go out.
    daemon._commit(old + new)
    daemon._send_acks()
    # Assert: one ack for id 7, the new connection's; the old message is redelivered by the
    # broker and then counted as a duplicate.
    assert sent == [7] and daemon.store.stats()["accepted"] == 2
