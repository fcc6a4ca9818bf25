"""The fedstream ServerApp: rounds of planned training, evaluation, metrics, checkpoints.

It drives the rounds itself (rather than Flower's ``Strategy.start``) so that it can
checkpoint after every round, resume from the last checkpoint, record per-device metrics,
and run asynchronously. It learns the run config's task, or the one it was built around
(:func:`make_server_app`). Before the first round of a fresh run, a timing probe
(:meth:`~aggregator.session.RunSession.probe`) gives the batch controller each device's
speed.

``mode = "sync"``, a round: wait for nodes,
:meth:`~aggregator.strategy.StreamStrategy.configure_train`,
:func:`~aggregator.exchange.exchange` the messages,
:meth:`~aggregator.strategy.StreamStrategy.aggregate_train` (with the devices' prequential
scores), evaluate on ``eval-data`` when the run has it, checkpoint, then append a
:class:`~aggregator.round_log.RoundRecord` to ``metrics.jsonl``.

``mode = "async"``: no rounds; each device gets new work as soon as it replies, and the
model moves every ``async-buffer`` updates (:mod:`aggregator.asynchronous`, FedBuff).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from flwr.app import ConfigRecord, Context
from flwr.common.logger import console_handler
from flwr.serverapp import Grid, ServerApp

from aggregator.asynchronous import run_async
from aggregator.exchange import exchange, superlink_outage_bound, wait_for_nodes
from aggregator.round_log import METRICS_FILE, RoundRecord, RoundTiming, virtual_round_s
from aggregator.secure_round import SecureRound
from aggregator.session import (
    RECORDS_KEPT,
    RunSession,
    is_virtual,
    virtual_time,
    with_run_dir,
)
from edge_client.task.interface import Task
from edge_client.wire.run_config import RunSettings

__all__ = ["LOGGED_PACKAGES", "app", "log_through_flower", "make_server_app", "run_rounds"]

#: The packages whose loggers the ServerApp shows in Flower's log.
LOGGED_PACKAGES = ("aggregator", "edge_client")

log = logging.getLogger(__name__)


def make_server_app(task: Task | None = None) -> ServerApp:
    """fedstream's ServerApp around a task: batch controller, codec, non-IID mitigation,
    checkpoints and metrics as fedstream's own app has them, learning ``task``.

    Parameters
    ----------
    task : Task, optional
        What is learned (the same as the ClientApp's). None: the task the run config names.

    Examples
    --------
    In a Flower app's ``server_app.py``::

        from aggregator.server_app import make_server_app
        from my_app.task import HarTask

        app = make_server_app(HarTask())
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        """Flower entry point: settings from the run config, then :func:`run_rounds`."""
        # Imported here: only a ServerApp's own process needs it (not the in-process runner).
        from edge_client.flower_internals import quicken_reply_pulls

        log_through_flower()
        quicken_reply_pulls()
        settings = with_run_dir(RunSettings.from_run_config(context.run_config), context.run_id)
        out_dir = settings.metrics_log.out_dir
        if out_dir:
            log.info("run %d writes %s", context.run_id, Path(out_dir) / METRICS_FILE)
        with superlink_outage_bound(grid, settings.exchange.superlink_timeout):
            run_rounds(grid, settings, task=task, run_id=context.run_id)

    return server_app


app = make_server_app()


def log_through_flower() -> None:
    """Give fedstream's loggers Flower's console handler at INFO, unless the app configured
    logging itself: Flower sends the ServerApp process's output to ``flwr run --stream`` and
    ``flwr log``, and these loggers have no handler of their own (Python would show only
    their warnings, without Flower's format)."""
    if logging.getLogger().handlers:
        return
    for name in LOGGED_PACKAGES:
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(console_handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False


def run_rounds(
    grid: Grid,
    settings: RunSettings,
    stop: Callable[[RoundRecord], bool] | None = None,
    task: Task | None = None,
    run_id: int | None = None,
) -> list[RoundRecord]:
    """Run (or resume) the federated training; return the records of the rounds run, the
    timing probe's first when one ran (``round`` 0: their times sum to the run's).

    Parameters
    ----------
    grid : Grid
        Flower's grid (deployment, simulation, or the in-process runner).
    settings : RunSettings
        The run's tunables; ``mode`` chooses synchronous rounds or asynchronous
        aggregation (:func:`aggregator.asynchronous.run_async`).
    stop : callable, optional
        Called with each round's record once it is checkpointed and logged; True ends the
        run there (e.g. a benchmark that runs for a declared length of virtual time).
    task : Task, optional
        What is learned; None: the task the run config names.
    run_id : int, optional
        Flower's run id, kept in each checkpoint (``fedstream resume`` waits for that run to
        end before it submits the next).
    """
    session = RunSession.open(settings, task, run_id)
    try:
        with session.watch_stop():
            probe = session.probe(grid)
            if settings.asynchrony.mode == "async":
                records = run_async(grid, session, stop)
            else:
                records = _sync_rounds(grid, session, stop)
            session.finish()
        if probe is not None:
            records.insert(0, probe)
    finally:
        session.close()
    return records


def _sync_rounds(
    grid: Grid, session: RunSession, stop: Callable[[RoundRecord], bool] | None
) -> list[RoundRecord]:
    """Synchronous rounds from ``session.start`` until the run is finished (with secure
    aggregation's stages after each round's training when the run asks)."""
    secure = None
    if session.settings.secure.secure_aggregation:
        secure = SecureRound(grid, session.strategy)
    try:
        return _rounds(grid, session, stop, secure)
    finally:
        if secure is not None:
            secure.close()


def _rounds(
    grid: Grid,
    session: RunSession,
    stop: Callable[[RoundRecord], bool] | None,
    secure: SecureRound | None,
) -> list[RoundRecord]:
    """:func:`_sync_rounds`' loop."""
    settings = session.settings
    strategy = session.strategy
    records: deque[RoundRecord] = deque(maxlen=RECORDS_KEPT)
    server_round = session.start
    while session.more_rounds(server_round):
        wait_for_nodes(grid, settings.exchange.min_nodes, settings.exchange.round_timeout)
        t0, clock0 = time.monotonic(), virtual_time(grid)
        arrays = session.arrays
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        done = exchange(grid, messages, settings.exchange.round_timeout)
        t_sent = done.pushed
        if secure is not None:
            new_arrays, report = secure.run(done.replies, done.sent)
        else:
            new_arrays, report = strategy.aggregate_train(server_round, done.replies, done.sent)
        skipped = session.skip_reason(report)
        if new_arrays is not None and not skipped:
            arrays = new_arrays
        t_aggregated = time.monotonic()
        test = session.evaluate(arrays)
        t_evaluated = time.monotonic()
        session.charge_server(grid, len(report.aggregated))
        wall = t_evaluated - t0
        # The last reply's pull ends the wait (a round that timed out waited until the end)
        t_replied = (
            t_aggregated
            if done.pending or not done.arrived
            else t_sent + max(done.arrived.values())
        )
        secure_s = report.secagg.stages_s if report.secagg is not None else 0.0
        timing = RoundTiming(
            plan_s=round(t_sent - t0, 4),
            replies_s=round(t_replied - t_sent, 4),
            aggregate_s=round(max(0.0, t_aggregated - t_replied - secure_s), 4),
            eval_s=round(t_evaluated - t_aggregated, 4),
            secagg_s=round(secure_s, 4),
        )
        # push to pull of each device's reply
        latency = {strategy.fleet.device_of(done.sent[i]): s for i, s in done.arrived.items()}
        # On a virtual clock, what the grid charged (a deadline waited out, a round with
        # every device off); else the slowest reply's compute + wait + transfer.
        virtual_s = (
            virtual_time(grid) - clock0
            if is_virtual(grid)
            else virtual_round_s(report.replies.values(), settings.uplink_mbps)
        )
        record = session.record(
            report,
            test,
            wall,
            virtual_s,
            timing=timing,
            latency={k: round(v, 3) for k, v in sorted(latency.items())},
            skipped=skipped,
        )
        # The cap's horizon is the time a stream has until the device trains again: a
        # virtual-clock grid's round, or the wall time a real round took (its replies'
        # compute and wait are a small part of it: Flower's own round trip is the rest).
        strategy.record_round_time(record.virtual_s if is_virtual(grid) else wall)
        record = session.commit(record, arrays)
        log.info(record.progress(settings.rounds.num_rounds, len(messages)))
        records.append(record)
        if session.finished(record, stop):
            break
        server_round += 1
    return list(records)
