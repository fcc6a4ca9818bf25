"""The buffer file's layout versions, and the stores that share the file: an ingest daemon
installed on the device and a ClientApp that arrives with each run may differ in version."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_client.runtime import schema
from edge_client.runtime.buffer import BufferStore, BufferStoreError
from edge_client.runtime.constants import SCHEMA_VERSION
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.outbox import Outbox
from edge_client.runtime.schema import MIGRATIONS
from edge_client.wire.codec import FeedbackState, encode
from edge_client.wire.frames import SampleBatch

# The layout the release before versions wrote (user_version 0), minus ``seen_ahead``, which
# files older still lack.
PREVIOUS_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE state (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE outbox (id INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE publishers (publisher TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY, n INTEGER NOT NULL, start INTEGER NOT NULL DEFAULT 0,
    ts BLOB NOT NULL, y BLOB NOT NULL, x BLOB NOT NULL
);
"""


def previous_release_buffer(path: Path) -> None:
    """A buffer as the previous release left it: 3 samples of shape (2,), counters, a
    publisher's sequence number, an error-feedback residual for run 7, a queued message."""
    db = sqlite3.connect(path)
    db.executescript(PREVIOUS_SCHEMA)
    db.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("shape", json.dumps([2])), ("policy", "truncation"), ("capacity", "100")],
    )
    x = np.arange(6, dtype="<f4")
    db.execute(
        "INSERT INTO chunks (n, ts, y, x) VALUES (3, ?, ?, ?)",
        (np.zeros(3, "<f8").tobytes(), np.array([0, 1, 2], "<i8").tobytes(), x.tobytes()),
    )
    db.executemany(
        "INSERT INTO counters VALUES (?, ?)", [("accepted", 3), ("received", 3), ("fill", 3)]
    )
    db.execute("INSERT INTO publishers VALUES ('p', 5)")
    residual = encode({"w": np.full(3, 0.5, np.float32)})
    db.executemany(
        "INSERT INTO state VALUES (?, ?)",
        [("codec-run", b"7"), ("codec-residual", residual), ("codec-gap", b"0.25")],
    )
    db.execute("INSERT INTO outbox (payload) VALUES (?)", (b"queued",))
    db.commit()
    db.close()


def user_version(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_buffer_of_the_previous_layout_opens_migrated_with_all_it_held(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "old.sqlite"
    previous_release_buffer(path)
    assert user_version(path) == 0
    # Execute
    store = BufferStore(path)
    # Assert: stamped with the current layout; samples, counters, de-dup memory, device
    # state and outbox all as they were.
    assert user_version(path) == SCHEMA_VERSION
    assert (store.shape, store.capacity, store.fill) == ((2,), 100, 3)
    assert store.take(3).y.tolist() == [0, 1, 2]
    redelivered = np.zeros((1, 2), np.float32)
    batch = SampleBatch(redelivered, np.zeros(1, np.int64), np.zeros(1), publisher="p", seq=5)
    assert store.append([batch]).duplicates == 1
    later = SampleBatch(redelivered, np.zeros(1, np.int64), np.zeros(1), publisher="p", seq=8)
    store.append([later])
    assert store.stats()["messages-missing"] == 2  # 6 and 7: counted above the old floor
    store.close()
    with DeviceStateStore(path) as state:
        feedback = state.feedback(7, {"w": np.zeros(3, np.float32)})
    assert feedback.gap == 0.25 and feedback.residual is not None
    np.testing.assert_array_equal(feedback.residual["w"], np.full(3, 0.5, np.float32))
    with Outbox(path) as outbox:
        assert [p for _, p in outbox.pending()] == [b"queued"]


def test_a_buffer_of_a_newer_layout_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # Prepare: a file a newer fedstream wrote
    path = tmp_path / "new.sqlite"
    BufferStore(path, shape=(2,)).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    # Execute / Assert: each store refuses it rather than misread it
    for open_it in (BufferStore, DeviceStateStore, Outbox):
        with pytest.raises(BufferStoreError, match="upgrade fedstream"):
            open_it(path)


def test_device_state_and_outbox_live_beside_the_samples(tmp_path: Path) -> None:
    # Prepare
    path = tmp_path / "dev.sqlite"
    BufferStore(path, shape=(2,)).close()
    # Execute
    with DeviceStateStore(path) as state, Outbox(path) as outbox:
        state.save_feedback(3, FeedbackState({"w": np.ones(2, np.float32)}, 0.1))
        state.set_inject_seq(state.inject_seq() + 1)
        outbox.put([b"a", b"b"])
        first = outbox.pending(limit=1)
        outbox.ack([i for i, _ in first])
    # Assert: all of it survives the processes that wrote it
    with DeviceStateStore(path) as state, Outbox(path) as outbox, BufferStore(path) as store:
        assert state.inject_seq() == 1
        assert state.feedback(3, {"w": np.zeros(2, np.float32)}).gap == 0.1
        assert [p for _, p in outbox.pending()] == [b"b"]
        assert store.fill == 0  # nothing of it counts as samples


def test_state_and_outbox_need_an_existing_buffer(tmp_path: Path) -> None:
    for open_it in (DeviceStateStore, Outbox):
        with pytest.raises(BufferStoreError, match="no buffer"):
            open_it(tmp_path / "missing.sqlite")


def test_every_layout_has_its_migration() -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION


def test_a_layout_1_buffer_gains_the_held_windows_table_and_keeps_its_samples(
    tmp_path: Path,
) -> None:
    # Prepare: a buffer of layout 1 (the release before windowing), with samples in it
    path = tmp_path / "v1.sqlite"
    with BufferStore(path, shape=(2, 3)) as store:
        store.append([SampleBatch(np.ones((5, 2, 3), np.float32), np.zeros(5, np.int64),
                                  np.arange(5.0))])  # fmt: skip
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE held_windows")
        db.execute("PRAGMA user_version = 1")
    # Execute
    with BufferStore(path) as store:
        stats = store.stats()
    # Assert
    assert user_version(path) == SCHEMA_VERSION and stats["fill"] == 5
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM held_windows").fetchone() == (0,)


def test_an_old_buffer_that_cannot_be_written_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a pre-version buffer, opened by a reader that may not write it. (The file
    # system's refusal is stood in for: these tests run as root, which writes anything.)
    path = tmp_path / "old.sqlite"
    previous_release_buffer(path)

    def read_only(db: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(schema, "MIGRATIONS", (read_only,))
    # Execute / Assert: the message says what is needed, not "not a fedstream buffer"
    match = f"must be migrated to {SCHEMA_VERSION}, which needs to write"
    with pytest.raises(BufferStoreError, match=match):
        BufferStore(path)
    assert user_version(path) == 0  # left as it was


def test_a_new_buffer_appears_only_once_it_is_whole(tmp_path: Path) -> None:
    # Prepare: a new file, watched from inside the transaction that makes it (others wait
    # for the file to exist and then open it: the ingest daemon makes it while they wait).
    path = tmp_path / "new.sqlite"
    seen: list[bool] = []
    # Execute
    db = schema.connect(path, create=True, initialise=lambda _db: seen.append(path.exists()))
    db.close()
    # Assert: not there while being made; there, stamped and alone, afterwards
    assert seen == [False]
    assert user_version(path) == SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["new.sqlite"]


def test_readers_racing_the_daemon_never_see_half_a_buffer(tmp_path: Path) -> None:
    # Prepare / Execute: each time, a reader opens the buffer as soon as it exists.
    failures = []
    for i in range(30):
        path = tmp_path / f"b{i}.sqlite"
        done = threading.Event()

        def read(path: Path = path, done: threading.Event = done) -> None:
            while not done.is_set():
                if path.exists():
                    try:
                        BufferStore(path).close()
                    except BufferStoreError as err:
                        failures.append(str(err))
                    return

        reader = threading.Thread(target=read)
        reader.start()
        BufferStore(path, shape=(2,)).close()
        done.set()
        reader.join()
    # Assert
    assert failures == []
