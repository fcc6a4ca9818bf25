"""ScaDLES data injection, device side: shared samples in, kept apart in a capped pool.

A device that opted in (``inject=true`` in its node config, ``fedstream ingest --inject``)
subscribes to ``fedstream/v1/inject``. What arrives there goes through :func:`receive` into
its *pool*, a buffer store of its own next to the device's buffer (tagged by where it lives,
capped at :data:`~edge_client.runtime.constants.INJECT_POOL_CAPACITY` with the truncation
policy, its own counters). The ClientApp draws each batch's planned share from the pool.

Sharing goes the other way through the buffer file's outbox: when the aggregator picks the
device, the ClientApp queues one frame of the samples it just trained on (:func:`share`),
and the ingest daemon, which holds the device's MQTT connection, publishes it. A device
that did not opt in queues nothing and its daemon publishes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import (
    INJECT_POOL_CAPACITY,
    INJECT_POOL_SUFFIX,
    POLICY_TRUNCATION,
)
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.outbox import Outbox
from edge_client.wire.constants import INJECT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import FrameError, SampleBatch, decode_payload, encode_frame

if TYPE_CHECKING:  # the ingest daemon imports this module: it must not load Flower
    from edge_client.wire.records import RoundPlan

__all__ = ["INJECT_REJECT_REASONS", "inject_pool_path", "open_pool", "receive", "share"]

#: Reasons an injection message is refused beyond those of any sample frame.
INJECT_REJECT_REASONS = ("too-large", "untagged")


def inject_pool_path(buffer: str | Path) -> Path:
    """Where a device keeps samples injected by others: a store of its own, next to its
    buffer, so that they are tagged by where they live, capped and counted apart."""
    path = Path(buffer)
    return path.with_name(path.stem + INJECT_POOL_SUFFIX)


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
    :data:`~edge_client.wire.constants.INJECT_MAX_PAYLOAD_BYTES`, and carry its publisher id (the
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


def share(
    buffer: str | Path,
    device_id: str,
    taken: SampleBatch,
    plan: RoundPlan,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Queue a fraction beta of the samples just trained on for injection, within the budget.

    One binary frame (publisher = this device, its next sequence number kept in the
    device state) goes to the buffer file's outbox; the ingest daemon publishes it to
    ``fedstream/v1/inject``.

    Returns
    -------
    tuple of int
        (bytes queued, samples queued); (0, 0) when the budget holds no sample.
    """
    per_sample = 4 * int(np.prod(taken.x.shape[1:])) + 16  # features + label + timestamp
    header = len(encode_frame(taken.x[:0], taken.y[:0], taken.ts[:0], publisher=device_id))
    fits = max(0, (min(plan.inject_budget, INJECT_MAX_PAYLOAD_BYTES) - header) // per_sample)
    n = min(int(plan.inject_beta * len(taken)), fits)
    if n <= 0:
        return 0, 0
    idx = np.sort(rng.choice(len(taken), size=n, replace=False))
    with DeviceStateStore(buffer) as state, Outbox(buffer) as outbox:
        seq = state.inject_seq() + 1
        payload = encode_frame(
            taken.x[idx], taken.y[idx], taken.ts[idx], publisher=device_id, seq=seq
        )
        # The number first: a crash between the two leaves a gap in the sequence (harmless)
        # rather than a number used twice (receivers would drop the next frame as a repeat).
        state.set_inject_seq(seq)
        outbox.put([payload])
    return len(payload), n
