"""ScaDLES data injection, device side: its one home (the aggregator's side, which devices
share and within what budget, is :mod:`aggregator.injection`).

A device takes part when its node config says ``inject=true`` and its ingest daemon runs
with ``--inject``. Then:

- :mod:`~edge_client.runtime.injection.pool`: what other devices shared arrives in the
  device's *pool*, a capped store of its own next to its buffer (:func:`receive`);
- :mod:`~edge_client.runtime.injection.mixing`: each training batch takes its planned share
  (``inject-mix``) from the pool, the rest from the device's own buffer;
- :mod:`~edge_client.runtime.injection.sharing`: when the aggregator picks the device, the
  ClientApp queues a fraction (``inject-beta``, within ``inject-budget``) of what it just
  trained on in the buffer file's outbox (:func:`share`);
- :mod:`~edge_client.runtime.injection.relay`: the ingest daemon, which holds the MQTT
  connection, receives into the pool and publishes the outbox (:class:`InjectionRelay`).

The node-config, run-config, wire and status keys keep the short word ``inject``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from edge_client.runtime.injection.mixing import draw_pooled, mix_into, planned_mix
    from edge_client.runtime.injection.pool import (
        INJECT_REJECT_REASONS,
        inject_pool_path,
        open_pool,
        receive,
        round_pool,
    )
    from edge_client.runtime.injection.relay import InjectionRelay
    from edge_client.runtime.injection.sharing import (
        Post,
        share,
        share_frame,
        share_when_picked,
    )

_EXPORTS = {
    "INJECT_REJECT_REASONS": "pool",
    "InjectionRelay": "relay",
    "draw_pooled": "mixing",
    "inject_pool_path": "pool",
    "mix_into": "mixing",
    "open_pool": "pool",
    "planned_mix": "mixing",
    "receive": "pool",
    "round_pool": "pool",
    "Post": "sharing",
    "share": "sharing",
    "share_frame": "sharing",
    "share_when_picked": "sharing",
}
__all__ = [
    "INJECT_REJECT_REASONS",
    "InjectionRelay",
    "Post",
    "draw_pooled",
    "inject_pool_path",
    "mix_into",
    "open_pool",
    "planned_mix",
    "receive",
    "round_pool",
    "share",
    "share_frame",
    "share_when_picked",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
