"""Sharing: a device the aggregator picked queues a fraction of what it just trained on.

The ClientApp lives one round and holds no MQTT connection, so the frame goes to the buffer
file's outbox (:class:`~edge_client.runtime.outbox.Outbox`); the ingest daemon publishes it
(:class:`~edge_client.runtime.injection.relay.InjectionRelay`). A device that did not opt in
queues nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.outbox import Outbox
from edge_client.wire.constants import DEFAULT_MAX_PAYLOAD_BYTES, INJECT_MAX_PAYLOAD_BYTES
from edge_client.wire.frames import SampleBatch, encode_frame

if TYPE_CHECKING:  # the ingest daemon loads this package: it must not load Flower
    from edge_client.runtime.node_config import NodeConfig
    from edge_client.wire.records import RoundPlan

__all__ = ["share", "share_when_picked"]


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
    # One frame within what every broker takes (AWS IoT Core: 128 KB) and receivers accept.
    cap = min(plan.inject_budget, INJECT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PAYLOAD_BYTES)
    fits = max(0, (cap - header) // per_sample)
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


def share_when_picked(
    node: NodeConfig,
    plan: RoundPlan,
    taken: SampleBatch | None,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """:func:`share` the round's own samples if the device opted in and the aggregator
    picked it this round (``plan.inject_publish``); (0, 0) otherwise."""
    if not (node.inject and plan.inject_publish and taken is not None):
        return 0, 0
    return share(node.buffer, node.device_id, taken, plan, rng)
