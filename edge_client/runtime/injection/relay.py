"""The ingest daemon's part in data injection: it holds the device's MQTT connection.

In: messages on ``fedstream/v1/inject`` go to the pool (:func:`~.pool.receive`), in the
daemon's transactions. Out: what the ClientApp queued in the outbox (:mod:`.sharing`) is
published there. Its counters go into the daemon's status under ``inject``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from edge_client.runtime.injection.pool import open_pool, receive
from edge_client.runtime.outbox import Outbox
from edge_client.wire.constants import INJECT_TOPIC

__all__ = ["InjectionRelay"]


class InjectionRelay:
    """The pool and outbox of the device whose buffer file is ``buffer`` (samples of
    ``shape``), between them and the broker.

    Parameters
    ----------
    buffer : Path
        The device's buffer file (the pool is next to it, the outbox in it).
    shape : sequence of int
        The device's sample shape (what the pool holds).
    device_id : str
        The device (its own shared messages are skipped).
    num_classes : int
        Labels are below this.
    """

    #: The topic shared samples travel on.
    topic = INJECT_TOPIC

    def __init__(
        self, buffer: Path, shape: Sequence[int], device_id: str, num_classes: int
    ) -> None:
        self.pool = open_pool(buffer, shape)
        self.outbox = Outbox(buffer)
        self.device_id = device_id
        self.num_classes = num_classes
        self.published = 0

    def receive(self, payloads: Sequence[bytes | bytearray]) -> Counter[str]:
        """Take messages that came on :attr:`topic` into the pool; the refused ones by
        reason, prefixed ``inject:`` (as the daemon logs them)."""
        refused = receive(self.pool, payloads, self.device_id, self.num_classes, time.time())
        return Counter({f"inject:{r}": n for r, n in refused.items()})

    def publish(self, client: mqtt.Client) -> None:
        """Publish what the ClientApp queued, oldest first, until the client refuses one
        (it stays queued in the buffer file)."""
        sent = []
        for row_id, payload in self.outbox.pending():
            if client.publish(self.topic, payload, qos=1).rc != mqtt.MQTT_ERR_SUCCESS:
                break
            sent.append(row_id)
        if sent:
            self.outbox.ack(sent)
            self.published += len(sent)

    def status(self) -> dict[str, Any]:
        """The status's ``inject`` block: the pool's fill and counters, messages published."""
        pool = self.pool.stats()
        return {
            "fill": pool["fill"],
            "accepted": pool["accepted"],
            "rejected": pool["rejected"],
            "rejected-by-reason": pool["rejected-by-reason"],
            "published": self.published,
        }

    def close(self) -> None:
        """Close the pool and the outbox."""
        self.pool.close()
        self.outbox.close()
