"""The injection pool: samples other devices shared, received into a store of their own.

A device that opted in (``inject=true`` in its node config, ``fedstream ingest --inject``)
subscribes to ``fedstream/v1/inject``. What arrives there goes through :func:`receive` into
its *pool*, a buffer store next to the device's buffer (tagged by where it lives, capped at
:data:`~edge_client.runtime.constants.INJECT_POOL_CAPACITY` with the truncation policy, its
own counters). :func:`round_pool` opens it for a round that mixes pool samples in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.constants import (
    INJECT_POOL_CAPACITY,
    INJECT_POOL_SUFFIX,
    POLICY_TRUNCATION,
)
from edge_client.wire.constants import INJECT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import FrameError, SampleBatch, decode_payload

if TYPE_CHECKING:  # the ingest daemon imports this module: it must not load Flower
    from edge_client.runtime.node_config import NodeConfig
    from edge_client.wire.records import RoundPlan

__all__ = ["INJECT_REJECT_REASONS", "inject_pool_path", "open_pool", "receive", "round_pool"]

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


@contextmanager
def round_pool(node: NodeConfig, plan: RoundPlan) -> Iterator[BufferStore | None]:
    """The pool a round mixes into its batches, open for the round: None unless the device
    opted in, the plan mixes (``inject-mix`` > 0) and the pool holds a file."""
    path = inject_pool_path(node.buffer)
    if not (node.inject and plan.inject_mix > 0 and path.exists()):
        yield None
        return
    with BufferStore(path) as pool:
        yield pool
