"""Sharing: a device the aggregator picked queues a fraction of what it just trained on.

The ClientApp lives one round and holds no MQTT connection, so the frame goes to the buffer
file's outbox (:class:`~edge_client.runtime.outbox.Outbox`); the ingest daemon publishes it
(:class:`~edge_client.runtime.injection.relay.InjectionRelay`). A simulated device posts it
to the simulation's stand-in for the topic instead
(:mod:`edge_client.emulation.shared_topic`). A device that did not opt in queues nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_client.runtime.device_state import DeviceState, DeviceStateStore
from edge_client.runtime.outbox import Outbox
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES, INJECT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import SampleBatch, encode_frame

if TYPE_CHECKING:  # the ingest daemon loads this package: it must not load Flower
    from edge_client.runtime.node_config import NodeConfig
    from edge_client.wire.records import RoundPlan

__all__ = ["Post", "share", "share_frame", "share_when_picked"]

#: Where a shared frame goes: the outbox's ``put``, or a simulated topic's.
Post = Callable[[bytes], None]


def share_frame(
    state: DeviceState,
    post: Post,
    device_id: str,
    taken: SampleBatch,
    plan: RoundPlan,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Post a fraction beta of the samples just trained on, within the budget, as one binary
    frame (publisher = this device, its next sequence number kept in ``state``).

    Returns
    -------
    tuple of int
        (bytes posted, samples posted); (0, 0) when the budget holds no sample.
    """
    per_sample = 4 * int(np.prod(taken.x.shape[1:])) + 16  # features + label + timestamp
    header = len(encode_frame(taken.x[:0], taken.y[:0], taken.ts[:0], publisher=device_id))
    # One frame within what every broker takes (AWS IoT Core: 128 KB) and receivers accept.
    cap = min(plan.inject_budget, INJECT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PAYLOAD_BYTES)
    fits = max(0, (cap - header) // per_sample)
    n = min(int(plan.inject_beta * len(taken)), fits)
    if n <= 0:
        return 0, 0
    idx = np.sort(rng.choice(len(taken), size=n, replace=False))
    seq = state.inject_seq() + 1
    payload = encode_frame(taken.x[idx], taken.y[idx], taken.ts[idx], publisher=device_id, seq=seq)
    # The number first: a crash between the two leaves a gap in the sequence (harmless)
    # rather than a number used twice (receivers would drop the next frame as a repeat).
    state.set_inject_seq(seq)
    post(payload)
    return len(payload), n


def share(
    buffer: str | Path,
    device_id: str,
    taken: SampleBatch,
    plan: RoundPlan,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """:func:`share_frame` into the buffer file's outbox, which the ingest daemon publishes
    to ``fedstream/v1/inject``; the sequence number in the file's device state."""
    with DeviceStateStore(buffer) as state:
        return _to_outbox(buffer, state, device_id, taken, plan, rng)


def _to_outbox(
    buffer: str | Path,
    state: DeviceState,
    device_id: str,
    taken: SampleBatch,
    plan: RoundPlan,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """:func:`share_frame` into the outbox of the buffer file at ``buffer``."""
    with Outbox(buffer) as outbox:
        return share_frame(
            state, lambda payload: outbox.put([payload]), device_id, taken, plan, rng
        )


def share_when_picked(
    node: NodeConfig,
    plan: RoundPlan,
    taken: SampleBatch | None,
    rng: np.random.Generator,
    state: DeviceState,
    post: Post | None = None,
) -> tuple[int, int]:
    """:func:`share_frame` the round's own samples if the device opted in and the aggregator
    picked it this round (``plan.inject_publish``); (0, 0) otherwise.

    Parameters
    ----------
    state : DeviceState
        The device's state, open for the round (it keeps the sequence number).
    post : callable, optional
        Where the frame goes; None: the buffer file's outbox.
    """
    if not (node.inject and plan.inject_publish and taken is not None):
        return 0, 0
    if post is None:
        return _to_outbox(node.buffer, state, node.device_id, taken, plan, rng)
    return share_frame(state, post, node.device_id, taken, plan, rng)
