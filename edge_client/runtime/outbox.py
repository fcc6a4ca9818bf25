"""The outbox: messages the ClientApp leaves for the ingest daemon to publish.

The ingest daemon holds the device's MQTT connection; a ClientApp process lives one round.
What the ClientApp wants sent (a frame of samples shared for data injection) waits in the
buffer file's ``outbox`` table until the daemon has handed it to the broker.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_client.runtime.schema import SqliteStore, transaction

__all__ = ["Outbox"]


class Outbox(SqliteStore):
    """The outbox of the device whose buffer file is ``path`` (which must exist).

    Raises
    ------
    BufferStoreError
        If there is no buffer file at ``path``, or it is not one.
    """

    def put(self, payloads: Sequence[bytes]) -> None:
        """Queue messages, in order, in one transaction."""
        with transaction(self._db) as db:
            db.executemany("INSERT INTO outbox (payload) VALUES (?)", [(p,) for p in payloads])

    def pending(self, limit: int = 100) -> list[tuple[int, bytes]]:
        """The oldest queued messages, as ``(id, payload)``."""
        rows = self._db.execute(
            "SELECT id, payload FROM outbox ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [(int(i), bytes(p)) for i, p in rows]

    def ack(self, ids: Sequence[int]) -> None:
        """Forget messages that were handed to the broker."""
        with transaction(self._db) as db:
            db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
