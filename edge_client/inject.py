"""ScaDLES data injection, device side: shared samples in, kept apart in a capped pool.

A device that opted in (``inject=true`` in its node config, ``fedstream ingest --inject``)
subscribes to ``fedstream/v1/inject``. What arrives there goes through :func:`receive` into
its *pool*, a buffer store of its own next to the device's buffer (tagged by where it lives,
capped at :data:`~edge_client.constants.INJECT_POOL_CAPACITY` with the truncation policy, its
own counters). The ClientApp draws each batch's planned share from the pool.

Sharing goes the other way through the buffer's outbox: the ClientApp queues one frame of
the samples it just trained on when the aggregator picks it, and the ingest daemon, which
holds the device's MQTT connection, publishes it. A device that did not opt in queues nothing
and its daemon publishes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from edge_client.buffer import BufferStore, inject_pool_path
from edge_client.constants import INJECT_MAX_PAYLOAD_BYTES, INJECT_POOL_CAPACITY, POLICY_TRUNCATION
from edge_client.frames import FrameError, SampleBatch, decode_payload

__all__ = ["INJECT_REJECT_REASONS", "open_pool", "receive"]

#: Reasons an injection message is refused beyond those of any sample frame.
INJECT_REJECT_REASONS = ("too-large", "untagged")


def open_pool(buffer: str | Path, shape: Sequence[int]) -> BufferStore:
    """The injection pool of the device whose buffer is ``buffer`` (created if needed)."""
    return BufferStore(
        inject_pool_path(buffer),
        shape=shape,
        policy=POLICY_TRUNCATION,
        capacity=INJECT_POOL_CAPACITY,
    )


def receive(
    pool: BufferStore,
    payloads: Sequence[bytes | bytearray],
    device_id: str,
    num_classes: int,
    now: float,
) -> Counter[str]:
    """Validate injection messages and append the good ones to the pool, in one transaction.

    A message must be a sample frame (binary or JSON) of the device's shape, at most
    :data:`~edge_client.constants.INJECT_MAX_PAYLOAD_BYTES`, and carry its publisher id (the
    origin tag, also what de-duplicates redeliveries); the device's own messages are skipped.

    Returns
    -------
    collections.Counter
        Refused messages by reason (also counted in the pool's ``rejected`` counters).
    """
    rejected: Counter[str] = Counter()
    batches: list[SampleBatch] = []
    own = 0
    for payload in payloads:
        if len(payload) > INJECT_MAX_PAYLOAD_BYTES:
            rejected["too-large"] += 1
            continue
        try:
            batch = decode_payload(payload, pool.shape, num_classes, now=now)
        except FrameError as err:
            rejected[err.reason] += 1
            continue
        if not batch.publisher:
            rejected["untagged"] += 1
        elif batch.publisher == device_id:
            own += 1
        else:
            batches.append(batch)
    if batches or rejected:
        pool.append(batches, rejected=rejected, messages=len(payloads) - own)
    return rejected
