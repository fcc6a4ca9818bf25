"""The simulation engine's stand-in for the broker's injection topic.

Real devices share ScaDLES samples over ``fedstream/v1/inject`` (their ingest daemons publish
and receive, :mod:`edge_client.runtime.injection`). Virtual devices have no broker: a frame a
picked device shares in round ``r`` is a file under the run's simulation directory
(``inject/<r>/<device>.frame``, written whole, then renamed), and every other opted-in device
receives the frames of rounds before its own into its pool when its next round starts, as
its ingest daemon would have between rounds. Rounds, not wall time, order delivery: a frame
shared in a round reaches no device in that same round (on a real fleet it might, if the
broker is fast and the round long), so a seeded run repeats whatever order Ray runs nodes in.
"""

from __future__ import annotations

import os
from pathlib import Path

from edge_client.emulation.constants import SHARED_TOPIC_DIR

__all__ = ["SharedTopic"]

_SUFFIX = ".frame"


class SharedTopic:
    """Frames shared by a simulation run's virtual devices, kept by round under ``root``.

    Parameters
    ----------
    root : Path
        The run's directory of virtual devices (where their buffer files would be).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / SHARED_TOPIC_DIR

    def publish(self, server_round: int, device_id: str, payload: bytes) -> None:
        """Keep ``device_id``'s frame of ``server_round`` (one a round: a device is picked
        at most once a round; a retried round replaces it)."""
        where = self.root / f"{server_round:08d}"
        where.mkdir(parents=True, exist_ok=True)
        final = where / f"{device_id}{_SUFFIX}"
        partial = final.with_name(f".{final.name}.{os.getpid()}")
        partial.write_bytes(payload)
        os.replace(partial, final)  # a reader sees the whole frame or none

    def frames(self, after: int, before: int) -> list[bytes]:
        """The frames shared in rounds ``after + 1`` to ``before - 1``, by round, then by
        device."""
        if not self.root.is_dir():
            return []
        rounds = sorted(
            d for d in self.root.iterdir() if d.name.isdigit() and after < int(d.name) < before
        )
        return [
            f.read_bytes()
            for d in rounds
            for f in sorted(d.iterdir())
            if f.suffix == _SUFFIX and not f.name.startswith(".")
        ]
