"""The device's buffer file: one SQLite database (WAL mode), its layout and its migrations.

Three stores share the file, each with tables of its own, each on its own connection:

- :class:`~edge_client.runtime.buffer.BufferStore`: samples (``chunks``), ``counters``,
  ``meta``, and the de-duplication windows (``publishers``, ``seen_ahead``);
- :class:`~edge_client.runtime.device_state.DeviceStateStore`: what must outlive one
  ClientApp process (``state``);
- :class:`~edge_client.runtime.outbox.Outbox`: messages the ingest daemon publishes for the
  ClientApp (``outbox``).

The ingest daemon is installed on the device while the ClientApp arrives with each run, so
the two may be of different versions. The layout is versioned in SQLite's ``user_version``:

- 0: files made before versions existed (the tables below, ``seen_ahead`` possibly missing);
- 1: the tables below, stamped;
- 2: ``held_windows``, windows of a per-reading stream waiting for their label
  (:mod:`edge_client.runtime.windowing`);
- 3: ``publishers`` also holds each publisher's lowest and highest stored sequence numbers
  and the numbers forgotten unseen (``low``, ``high``, ``lost``: what never arrived).

Opening a file migrates it to :data:`~edge_client.runtime.constants.SCHEMA_VERSION` in one
transaction (a crash leaves the old layout whole); a file of a newer layout is refused with
a message that says so, rather than misread.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from edge_client.runtime.constants import SCHEMA_VERSION, SQLITE_BUSY_TIMEOUT_S, SQLITE_PAGE_SIZE

__all__ = ["BufferStoreError", "SqliteStore", "connect", "schema_version", "transaction"]


class BufferStoreError(RuntimeError):
    """The buffer file is missing, not a fedstream buffer, or configured incompatibly."""


_TABLES_V1 = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS publishers (publisher TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS seen_ahead (publisher TEXT PRIMARY KEY, bits BLOB NOT NULL)",
    """CREATE TABLE IF NOT EXISTS chunks (
        id INTEGER PRIMARY KEY,
        n INTEGER NOT NULL,
        start INTEGER NOT NULL DEFAULT 0,
        ts BLOB NOT NULL,
        y BLOB NOT NULL,
        x BLOB NOT NULL
    )""",
)


def _to_v1(db: sqlite3.Connection) -> None:
    """0 -> 1: create what a new or pre-version file lacks (its data is already v1)."""
    for statement in _TABLES_V1:
        db.execute(statement)


def _to_v2(db: sqlite3.Connection) -> None:
    """1 -> 2: a table for windows waiting for their label."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS held_windows "
        "(id INTEGER PRIMARY KEY, ts REAL NOT NULL, x BLOB NOT NULL)"
    )


def _to_v3(db: sqlite3.Connection) -> None:
    """2 -> 3: each publisher's span of sequence numbers, for counting what never arrived
    (NULL for publishers met before: counting starts above their floor)."""
    have = {row[1] for row in db.execute("PRAGMA table_info(publishers)")}
    for column in ("low INTEGER", "high INTEGER", "lost INTEGER NOT NULL DEFAULT 0"):
        if column.split()[0] not in have:
            db.execute(f"ALTER TABLE publishers ADD COLUMN {column}")


def _to_v4(db: sqlite3.Connection) -> None:
    """3 -> 4: the samples a round has taken and not yet settled (its trainer may die)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS taken "
        "(id INTEGER PRIMARY KEY, n INTEGER NOT NULL, ts BLOB NOT NULL, y BLOB NOT NULL, "
        "x BLOB NOT NULL)"
    )


#: MIGRATIONS[v] takes a file from layout v to v + 1 (one per version: a test holds it).
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_to_v1, _to_v2, _to_v3, _to_v4)


Initialise = Callable[[sqlite3.Connection], object]


def connect(
    path: str | Path, *, create: bool = False, initialise: Initialise | None = None
) -> sqlite3.Connection:
    """Open (or, with ``create``, make) a buffer file, migrated to the current layout.

    A new file is made whole before it appears: built under a temporary name (layout,
    then ``initialise`` in the same transaction) and renamed into place, so that a file at
    ``path`` is always a complete buffer (the ingest daemon makes it while others wait for
    it to exist and open it).

    Raises
    ------
    BufferStoreError
        If the file does not exist and ``create`` is false, is not a SQLite database, or
        has a newer layout than this fedstream reads.
    """
    path = Path(path)
    if path.is_dir():
        raise BufferStoreError(
            f"{path} is a directory: give the buffer file (e.g. {path}/pi-1.sqlite)"
        )
    if not path.exists():
        if not create:
            raise BufferStoreError(f"no buffer at {path} (start `fedstream ingest` first)")
        _create(path, initialise)
    db = _open(path)
    try:
        _migrate(db, path)
    except sqlite3.DatabaseError as err:
        db.close()
        raise BufferStoreError(f"{path} is not a fedstream buffer: {err}") from err
    except BufferStoreError:
        db.close()
        raise
    return db


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(
        path,
        timeout=SQLITE_BUSY_TIMEOUT_S,
        isolation_level=None,  # we issue BEGIN/COMMIT ourselves
        check_same_thread=False,  # the ingest writer thread owns it after start-up
    )
    try:
        # Large pages: a 64-sample row is ~50 KB; takes effect only on a new file.
        db.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL survives a killed process (only power loss can lose the last commits).
        db.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.DatabaseError as err:
        db.close()
        raise BufferStoreError(f"{path} is not a fedstream buffer: {err}") from err
    return db


def _create(path: Path, initialise: Initialise | None) -> None:
    """Build a new buffer file under a temporary name, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.new")
    db = _open(draft)
    try:
        with transaction(db):
            for step in MIGRATIONS:
                step(db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if initialise is not None:
                initialise(db)
    finally:
        db.close()  # the last connection: SQLite folds the WAL into the file and removes it
    os.replace(draft, path)


def schema_version(db: sqlite3.Connection) -> int:
    """The file's layout version (SQLite ``user_version``)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    version = schema_version(db)
    if version == SCHEMA_VERSION:
        return  # the usual case: a reader writes nothing (full disks, read-only tools)
    if version > SCHEMA_VERSION:
        raise BufferStoreError(
            f"{path} has buffer layout {version}; this fedstream reads up to "
            f"{SCHEMA_VERSION}: upgrade fedstream on this device"
        )
    try:
        with transaction(db):  # another process may be migrating it: read again, inside
            version = schema_version(db)
            for step in MIGRATIONS[version:]:
                step(db)
            if version < SCHEMA_VERSION:
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except sqlite3.OperationalError as err:
        raise BufferStoreError(
            f"{path} has buffer layout {version} and must be migrated to {SCHEMA_VERSION}, "
            f"which needs to write it ({err}): open it once as its owner, or start its ingest "
            "daemon"
        ) from err
    if version > SCHEMA_VERSION:  # a newer fedstream migrated it while we waited
        raise BufferStoreError(
            f"{path} has buffer layout {version}; this fedstream reads up to "
            f"{SCHEMA_VERSION}: upgrade fedstream on this device"
        )


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (``BEGIN IMMEDIATE``): all of it or none of it."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class SqliteStore:
    """A store on its own connection to a buffer file: open, close, ``with``.

    Parameters
    ----------
    path : str or Path
        The buffer file.
    create : bool
        Make the file if it does not exist (otherwise it must).
    initialise : callable, optional
        Writes what a new file starts with, in the transaction that makes it.

    Raises
    ------
    BufferStoreError
        If the file is missing (and not to be made), not a buffer, or of a newer layout.
    """

    def __init__(
        self, path: str | Path, *, create: bool = False, initialise: Initialise | None = None
    ) -> None:
        self.path = Path(path)
        self._db = connect(self.path, create=create, initialise=initialise)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
