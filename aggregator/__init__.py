"""The aggregator: fedstream's ServerApp and what it is built from.

- :mod:`~aggregator.server_app`: the ServerApp (``app``, or :func:`make_server_app` around a
  user's task) and its synchronous round loop;
- :mod:`~aggregator.asynchronous`: the asynchronous mode's loop (FedBuff);
- :mod:`~aggregator.session`: what both loops share, a thin composition (start or resume,
  probe, evaluation, and the commit of each round);
- :mod:`~aggregator.resume`: the checkpoint a run resumes from, and what a round's keeps;
- :mod:`~aggregator.divergence`: the watch on rounds in a row in which training diverged;
- :mod:`~aggregator.exports`: versioned model exports, and when they are due;
- :mod:`~aggregator.sinks`, :mod:`~aggregator.prometheus_sink`: where each round's
  figures go besides ``metrics.jsonl`` (the figures: :mod:`~aggregator.round_figures`);
- :mod:`~aggregator.exchange`: pushing messages and pulling their replies;
- :mod:`~aggregator.server_eval`: server-side evaluation on ``eval-data``;
- :mod:`~aggregator.strategy`: per-device plans out, validated and weighted updates in;
- :mod:`~aggregator.device_registry`: the fleet registry (nodes, devices, failures, refusals);
- :mod:`~aggregator.aggregation`, :mod:`~aggregator.robust`: how updates are combined;
- :mod:`~aggregator.fedbuff`: buffered asynchronous aggregation (FedBuff's rule and its
  bookkeeping);
- :mod:`~aggregator.controller`: the batch controller (OmniLearn, with ScaDLES' cap);
- :mod:`~aggregator.compression`: the round's codec mode;
- :mod:`~aggregator.injection`: data injection, aggregator side (ScaDLES): who shares
  samples, and each device's share of the byte budget;
- :mod:`~aggregator.round_log`, :mod:`~aggregator.checkpoint`: ``metrics.jsonl`` and the
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
    from aggregator.asynchronous import run_async
    from aggregator.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from aggregator.compression import choose_mode, round_mode
    from aggregator.controller import BatchController, Plan
    from aggregator.device_registry import FleetRegistry
    from aggregator.divergence import RunDivergedError
    from aggregator.exchange import Exchange, exchange, wait_for_nodes
    from aggregator.fedbuff import UpdateBuffer, staleness_weight
    from aggregator.injection import InjectionPlanner, pick_injectors
    from aggregator.robust import robust_aggregate
    from aggregator.round_log import RoundRecord, append_record, read_metrics, virtual_round_s
    from aggregator.server_app import make_server_app, run_rounds
    from aggregator.server_eval import ServerEvaluation
    from aggregator.session import RunSession
    from aggregator.strategy import RoundReport, StreamStrategy

_EXPORTS = {
    "Accumulator": "aggregation",
    "Exchange": "exchange",
    "append_record": "round_log",
    "virtual_round_s": "round_log",
    "wait_for_nodes": "exchange",
    "run_async": "asynchronous",
    "RunSession": "session",
    "UpdateBuffer": "fedbuff",
    "staleness_weight": "fedbuff",
    "BatchController": "controller",
    "Checkpoint": "checkpoint",
    "FleetRegistry": "device_registry",
    "Plan": "controller",
    "NormalisedMean": "aggregation",
    "RobustRule": "aggregation",
    "RoundRecord": "round_log",
    "RoundReport": "strategy",
    "StreamStrategy": "strategy",
    "WeightedMean": "aggregation",
    "choose_mode": "compression",
    "exchange": "exchange",
    "load_checkpoint": "checkpoint",
    "make_accumulator": "aggregation",
    "pick_injectors": "injection",
    "InjectionPlanner": "injection",
    "RunDivergedError": "divergence",
    "read_metrics": "round_log",
    "rounds_only": "round_log",
    "PROBE_ROUND": "round_log",
    "robust_aggregate": "robust",
    "round_mode": "compression",
    "run_rounds": "server_app",
    "make_server_app": "server_app",
    "ServerEvaluation": "server_eval",
    "save_checkpoint": "checkpoint",
}
__all__ = [
    "PROBE_ROUND",
    "Accumulator",
    "BatchController",
    "Checkpoint",
    "Exchange",
    "FleetRegistry",
    "InjectionPlanner",
    "NormalisedMean",
    "Plan",
    "RobustRule",
    "RoundRecord",
    "RoundReport",
    "RunDivergedError",
    "RunSession",
    "ServerEvaluation",
    "StreamStrategy",
    "UpdateBuffer",
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
    "rounds_only",
    "run_async",
    "run_rounds",
    "save_checkpoint",
    "staleness_weight",
    "virtual_round_s",
    "wait_for_nodes",
]
__getattr__ = lazy_exports(__name__, _EXPORTS)
