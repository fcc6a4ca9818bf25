"""The fedstream ServerApp: rounds of planned training, evaluation, metrics, checkpoints.

It drives the rounds itself (rather than Flower's ``Strategy.start``) so that it can
checkpoint after every round, resume from the last checkpoint, and record per-device
metrics. It learns the run config's task, or the one it was built around
(:func:`make_server_app`). Before the first round of a fresh run, a timing probe
(:meth:`~aggregator.strategy.StreamStrategy.configure_probe`) gives the batch controller each
device's speed. A round: wait for nodes,
:meth:`~aggregator.strategy.StreamStrategy.configure_train`,
:func:`exchange` the messages, :meth:`~aggregator.strategy.StreamStrategy.aggregate_train`
(with the devices' prequential scores), evaluate on ``eval-data`` when the run has it,
checkpoint, then append a :class:`~aggregator.records.RoundRecord` to
``metrics.jsonl``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp

from aggregator.checkpoint import RUN_CONFIG, Checkpoint, load_checkpoint, save_checkpoint
from aggregator.controller import BatchController
from aggregator.evaluation import ServerEvaluation
from aggregator.fleet import FleetRegistry
from aggregator.records import RoundRecord, append_record, virtual_round_s
from aggregator.strategy import RoundReport, StreamStrategy
from edge_client.task.interface import Scores, Task, init_model
from edge_client.task.loading import load_task
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings, parse_shape, upgrade_saved

__all__ = ["Exchange", "app", "exchange", "make_server_app", "run_rounds", "wait_for_nodes"]

log = logging.getLogger(__name__)
PULL_INTERVAL_S = 0.2
#: Message ids per pull: a pull's replies are held together until each is handed over, so
#: this bounds the replies in memory at once (Flower's grids return a pull's replies as a list).
PULL_BATCH = 32


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
        run_rounds(grid, RunSettings.from_run_config(context.run_config), task=task)

    return server_app


app = make_server_app()


def run_rounds(
    grid: Grid,
    settings: RunSettings,
    stop: Callable[[RoundRecord], bool] | None = None,
    task: Task | None = None,
) -> list[RoundRecord]:
    """Run (or resume) the federated training; return the records of the rounds run.

    Parameters
    ----------
    grid : Grid
        Flower's grid (deployment, simulation, or the in-process runner).
    settings : RunSettings
        The run's tunables.
    stop : callable, optional
        Called with each round's record once it is checkpointed and logged; True ends the
        run there (e.g. a benchmark that runs for a declared length of virtual time).
    task : Task, optional
        What is learned; None: the task the run config names.
    """
    task = task or load_task(settings)
    model = init_model(task, settings.shape, settings.num_classes, settings.seed)
    held_out = ServerEvaluation.from_settings(settings, task)
    arrays = ArrayRecord(model.state_dict())
    controller = BatchController(settings)
    fleet = FleetRegistry()
    start = 1
    ckpt = (
        load_checkpoint(settings.checkpoint_dir)
        if settings.checkpoint_dir and settings.resume
        else None
    )
    if ckpt is not None:
        _check_resumable(ckpt, settings)
        arrays = ckpt.arrays
        controller = BatchController.from_state_dict(ckpt.controller, settings)
        fleet.load_state_dict(ckpt.extra)
        start = ckpt.server_round + 1
        log.info("resuming after round %d from %s", ckpt.server_round, settings.checkpoint_dir)
        if start > settings.num_rounds:
            log.info("the checkpoint already holds all %d rounds: nothing to do", start - 1)
    strategy = StreamStrategy(settings, controller, fleet)
    out = Path(settings.out_dir) if settings.out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    records: list[RoundRecord] = []
    t_run = time.monotonic()
    if start == 1:
        _probe(grid, strategy, settings)
    for server_round in range(start, settings.num_rounds + 1):
        wait_for_nodes(grid, settings.min_nodes, settings.round_timeout)
        t0 = time.monotonic()
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        done = exchange(grid, messages, settings.round_timeout)
        new_arrays, report = strategy.aggregate_train(server_round, done.replies, done.sent)
        if new_arrays is not None:
            arrays = new_arrays
        test = None
        if held_out is not None:
            model.load_state_dict(arrays.to_torch_state_dict())
            test = held_out(model)
        wall = time.monotonic() - t0
        run_wall = time.monotonic() - t_run
        record = _round_record(report, fleet, settings, task, test, wall, run_wall)
        # The cap's horizon is the time a stream has until the device trains again: a
        # virtual-clock grid's round, or the wall time a real round took (its replies'
        # compute and wait are a small part of it: Flower's own round trip is the rest).
        strategy.record_round_time(record.virtual_s if _virtual(grid) else wall)
        records.append(record)
        log.info(
            "round %d: %s %.3f (prequential, %d samples)%s, %d of %d devices, sum b %d",
            server_round,
            task.metric,
            record.accuracy,
            record.eval_count,
            "" if test is None else f", {record.test_accuracy:.3f} on eval-data",
            len(report.replies),
            len(messages),
            record.sum_b,
        )
        # Checkpoint first: a crash between the two leaves a round checkpointed but not in
        # metrics.jsonl (a gap in a log), never a logged round that a resume runs again.
        if settings.checkpoint_dir:
            save_checkpoint(
                settings.checkpoint_dir,
                Checkpoint(
                    server_round,
                    arrays,
                    strategy.controller.state_dict(),
                    {**fleet.state_dict(), RUN_CONFIG: settings.to_run_config()},
                ),
            )
        if out is not None:
            append_record(out / "metrics.jsonl", record)
        if stop is not None and stop(record):
            break
    return records


def _virtual(grid: Grid) -> bool:
    """Whether ``grid`` runs on a virtual clock (the in-process runner says so with a
    ``virtual_clock`` attribute; Flower's grids run on the wall clock)."""
    return bool(getattr(grid, "virtual_clock", False))


def _probe(grid: Grid, strategy: StreamStrategy, settings: RunSettings) -> None:
    """Before round 1: time each device's steps so that the first plan follows its speed."""
    wait_for_nodes(grid, settings.min_nodes, settings.round_timeout)
    messages = strategy.configure_probe(grid)
    if not messages:
        return
    t0 = time.monotonic()
    done = exchange(grid, messages, settings.round_timeout)
    probed = strategy.read_probe(done.replies, done.sent)
    log.info(
        "probed %d of %d devices' step times in %.1f s",
        len(probed),
        len(messages),
        time.monotonic() - t0,
    )


#: Settings a checkpoint's model depends on: a resume must not change them.
MODEL_SETTINGS = ("task", "model", "model_width", "sample_shape", "num_classes")


def _check_resumable(ckpt: Checkpoint, settings: RunSettings) -> None:
    """Refuse a checkpoint made for another model (its arrays would not fit).

    Raises
    ------
    ValueError
        If the checkpoint's run config names another task, model, sample shape or class
        count.
    """
    saved = upgrade_saved(ckpt.extra.get(RUN_CONFIG, {}))

    def same(name: str) -> bool:
        old, new = saved[kebab(name)], getattr(settings, name)
        if name == "sample_shape":  # "6,32" and "6x32" are one shape
            return parse_shape(str(old)) == settings.shape
        return bool(old == new)

    changed = [
        f"{kebab(name)}: {saved[kebab(name)]!r} -> {getattr(settings, name)!r}"
        for name in MODEL_SETTINGS
        if kebab(name) in saved and not same(name)
    ]
    if changed:
        raise ValueError(
            f"cannot resume from {settings.checkpoint_dir}: it holds a model for another "
            f"configuration ({'; '.join(changed)}); use a new checkpoint-dir or resume=false"
        )


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> None:
    """Wait until ``count`` nodes are connected (SuperNodes register after the run starts).

    Raises
    ------
    RuntimeError
        If fewer than ``count`` (and none at all) are there after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    nodes = list(grid.get_node_ids())
    while len(nodes) < count and time.monotonic() < deadline:
        time.sleep(PULL_INTERVAL_S)
        nodes = list(grid.get_node_ids())
    if not nodes:
        raise RuntimeError(f"no SuperNode connected within {timeout:.0f} s")
    if len(nodes) < count:
        log.warning("only %d of %d nodes connected; going on with them", len(nodes), count)


class Exchange:
    """One round's message exchange: the messages pushed, and their replies as they come.

    Iterating over :attr:`replies` pulls from the grid, at most :data:`PULL_BATCH` message
    ids at a time, and hands each reply over as it is pulled, until every message has its
    reply or the timeout has passed (a pull started after it is the last). Nothing keeps a
    reply once it is handed over, so a consumer that adds each reply in before it reads the
    next (:meth:`~aggregator.strategy.StreamStrategy.aggregate_train`) holds one pull's worth
    of replies at most, however large the fleet. The replies can be read once.

    Attributes
    ----------
    sent : dict of str to int
        Message id -> destination node of every message pushed.
    pending : dict of str to int
        The messages still without a reply (all of :attr:`sent` before the replies are
        read; those that timed out after).
    replies : iterator of Message
        The replies (error replies included), pulled as they are read.
    """

    def __init__(self, grid: Grid, sent: dict[str, int], timeout: float) -> None:
        self.sent = sent
        self.pending = dict(sent)
        self.replies: Iterator[Message] = self._pull(grid, time.monotonic() + timeout)

    def __iter__(self) -> Iterator[Message]:
        return self.replies

    def _pull(self, grid: Grid, deadline: float) -> Iterator[Message]:
        while self.pending:
            started = time.monotonic()
            ids = list(self.pending)
            for first in range(0, len(ids), PULL_BATCH):
                batch = deque(grid.pull_messages(ids[first : first + PULL_BATCH]))
                while batch:  # popped: a reply handed over is no longer held here
                    reply = batch.popleft()
                    answers = reply.metadata.reply_to_message_id
                    if self.pending.pop(answers, None) is None:
                        log.warning("dropped a message that answers none pending: %r", answers)
                        continue
                    yield reply
            if not self.pending or started >= deadline:
                return
            time.sleep(max(0.0, min(PULL_INTERVAL_S, deadline - time.monotonic())))


def exchange(grid: Grid, messages: list[Message], timeout: float) -> Exchange:
    """Push the round's messages; their replies are pulled as :attr:`Exchange.replies` is
    read, until all are in or ``timeout`` (from now) passes.

    Unlike ``Grid.send_and_receive`` this keeps the message ids (an error reply names
    the SuperLink as its source, so the ids are how a failed device is found), polls
    every 0.2 s instead of every 3 s, and never holds all the replies at once: each is
    handed to the strategy as it is pulled (a message without a reply by the timeout is
    in :attr:`Exchange.sent` and not answered: a failure of its device).
    """
    ids = list(grid.push_messages(messages))
    return Exchange(
        grid, {i: m.metadata.dst_node_id for i, m in zip(ids, messages, strict=True)}, timeout
    )


def _round_record(
    report: RoundReport,
    fleet: FleetRegistry,
    settings: RunSettings,
    task: Task,
    test: Scores | None,
    wall: float,
    run_wall: float,
) -> RoundRecord:
    return RoundRecord(
        round=report.server_round,
        accuracy=report.eval_metric,
        loss=report.eval_loss,
        eval_count=report.eval_count,
        test_accuracy=math.nan if test is None else test.metric,
        test_loss=math.nan if test is None else test.loss,
        metric=task.metric,
        global_batch=settings.global_batch,
        sum_b=report.sum_b,
        lr_scale=report.lr_scale,
        planned=report.planned,
        devices=report.replies,
        failed=dict(fleet.failed),
        rejected=dict(fleet.rejected),
        rejected_reasons=dict(fleet.rejected_reasons),
        compress=report.compress,
        aggregation=settings.aggregation,
        aggregated=sorted(report.aggregated),
        bytes_up=sum(m.bytes_up for m in report.replies.values()),
        broadcast_bytes=report.broadcast_bytes,
        inject_picked=report.injectors,
        inject_bytes=sum(m.inject_bytes for m in report.replies.values()),
        virtual_s=round(virtual_round_s(report.replies.values(), settings.uplink_mbps), 6),
        wall_s=round(wall, 3),
        run_wall_s=round(run_wall, 3),
    )
