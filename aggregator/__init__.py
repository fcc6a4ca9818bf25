"""The aggregator: fedstream's ServerApp and what it is built from.

- :mod:`~aggregator.server_app`: the ServerApp (``app``, or :func:`make_server_app` around a
  user's task) and its round loop;
- :mod:`~aggregator.evaluation`: server-side evaluation on ``eval-data``;
- :mod:`~aggregator.strategy`: per-device plans out, validated and weighted updates in;
- :mod:`~aggregator.fleet`: the fleet registry (nodes, devices, failures, refusals);
- :mod:`~aggregator.aggregation`, :mod:`~aggregator.robust`: how updates are combined;
- :mod:`~aggregator.fedbuff`: buffered asynchronous aggregation (FedBuff's rule and its
  bookkeeping; not yet driven by the round loop);
- :mod:`~aggregator.controller`: the batch controller (OmniLearn, with ScaDLES' cap);
- :mod:`~aggregator.compression`, :mod:`~aggregator.injection`: the round's codec mode,
  and who shares samples (ScaDLES);
- :mod:`~aggregator.records`, :mod:`~aggregator.checkpoint`: ``metrics.jsonl`` and the
  checkpoints a run resumes from.

It imports only the wire and task layers of :mod:`edge_client`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from aggregator.aggregation import (
        Accumulator,
        NormalisedMean,
        RobustRule,
        WeightedMean,
        make_accumulator,
    )
    from aggregator.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from aggregator.compression import choose_mode, round_mode
    from aggregator.controller import BatchController, Plan
    from aggregator.evaluation import ServerEvaluation
    from aggregator.fleet import FleetRegistry
    from aggregator.injection import pick_injectors
    from aggregator.records import RoundRecord, append_record, read_metrics, virtual_round_s
    from aggregator.robust import robust_aggregate
    from aggregator.server_app import (
        Exchange,
        exchange,
        make_server_app,
        run_rounds,
        wait_for_nodes,
    )
    from aggregator.strategy import RoundReport, StreamStrategy

_EXPORTS = {
    "Accumulator": "aggregation",
    "Exchange": "server_app",
    "append_record": "records",
    "virtual_round_s": "records",
    "wait_for_nodes": "server_app",
    "BatchController": "controller",
    "Checkpoint": "checkpoint",
    "FleetRegistry": "fleet",
    "Plan": "controller",
    "NormalisedMean": "aggregation",
    "RobustRule": "aggregation",
    "RoundRecord": "records",
    "RoundReport": "strategy",
    "StreamStrategy": "strategy",
    "WeightedMean": "aggregation",
    "choose_mode": "compression",
    "exchange": "server_app",
    "load_checkpoint": "checkpoint",
    "make_accumulator": "aggregation",
    "pick_injectors": "injection",
    "read_metrics": "records",
    "robust_aggregate": "robust",
    "round_mode": "compression",
    "run_rounds": "server_app",
    "make_server_app": "server_app",
    "ServerEvaluation": "evaluation",
    "save_checkpoint": "checkpoint",
}
__all__ = [
    "Accumulator",
    "BatchController",
    "Checkpoint",
    "Exchange",
    "FleetRegistry",
    "NormalisedMean",
    "Plan",
    "RobustRule",
    "RoundRecord",
    "RoundReport",
    "ServerEvaluation",
    "StreamStrategy",
    "WeightedMean",
    "append_record",
    "choose_mode",
    "exchange",
    "load_checkpoint",
    "make_accumulator",
    "make_server_app",
    "pick_injectors",
    "read_metrics",
    "robust_aggregate",
    "round_mode",
    "run_rounds",
    "save_checkpoint",
    "virtual_round_s",
    "wait_for_nodes",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
