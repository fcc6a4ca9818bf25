"""A run as the ServerApp drives it, in either mode: the thin composition both loops use.

:class:`RunSession` holds what is learned, the model and the state it starts or resumes
from (:mod:`aggregator.resume`), the strategy, evaluation on ``eval-data``
(:mod:`aggregator.server_eval`), and after each round (or asynchronous aggregation) commits
it: the checkpoint, a model export (:mod:`aggregator.exports`), the line of
``metrics.jsonl`` (:mod:`aggregator.round_log`), the sinks (:mod:`aggregator.sinks`) and
the divergence watch (:mod:`aggregator.divergence`).

The synchronous round loop (:mod:`aggregator.server_app`) and the asynchronous one
(:mod:`aggregator.asynchronous`) differ in how they exchange messages and combine updates;
everything else they share is here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid
from torch import nn

from aggregator.checkpoint import RUN_ID
from aggregator.controller import BatchController
from aggregator.device_registry import FleetRegistry
from aggregator.divergence import DivergenceWatch
from aggregator.exchange import exchange, wait_for_nodes
from aggregator.exports import ExportSchedule
from aggregator.privacy import Privacy
from aggregator.resume import (
    DIVERGED_ROUNDS,
    DRIFT,
    HETEROGENEITY,
    PRIVACY,
    SKIPPED,
    load_resume,
    save_round,
)
from aggregator.round_log import (
    METRICS_FILE,
    PROBE_ROUND,
    RoundRecord,
    append_record,
    runs_home,
)
from aggregator.server_eval import ServerEvaluation
from aggregator.sinks import RoundSink, open_sinks, write_all
from aggregator.stopping import StopRequest
from aggregator.strategy import DIVERGED, RoundReport, StreamStrategy
from edge_client.task.interface import Scores, Task, init_model
from edge_client.task.loading import load_task
from edge_client.task.personal import run_personal_keys, unshared_keys
from edge_client.wire.records import ProbeReply, RecordError
from edge_client.wire.run_config import RunSettings

__all__ = [
    "NO_OUT_DIR",
    "RECORDS_KEPT",
    "RunSession",
    "is_virtual",
    "virtual_time",
    "with_run_dir",
]

log = logging.getLogger(__name__)

#: Records a run returns at most (a continuous run's are in metrics.jsonl, not in memory).
RECORDS_KEPT = 1000
#: ``out-dir`` for a run that writes no ``metrics.jsonl`` at all.
NO_OUT_DIR = "none"


def with_run_dir(settings: RunSettings, run_id: int) -> RunSettings:
    """``settings`` of a run Flower started: an empty ``out-dir`` becomes the run's default
    folder (:func:`~aggregator.round_log.runs_home` / ``run_id``), and ``none`` no folder."""
    out_dir = settings.metrics_log.out_dir
    if out_dir == NO_OUT_DIR:
        return replace(settings, out_dir="")
    if out_dir:
        return settings
    return replace(settings, out_dir=str(runs_home() / str(run_id)))


def is_virtual(grid: Grid) -> bool:
    """Whether ``grid`` runs on a virtual clock (the in-process runner says so with a
    ``virtual_clock`` attribute, and keeps the time in ``clock``; Flower's grids run on the
    wall clock)."""
    return bool(getattr(grid, "virtual_clock", False))


def virtual_time(grid: Grid) -> float:
    """The virtual time of a grid that keeps one (0 on a wall-clock grid)."""
    return float(getattr(grid, "clock", 0.0)) if is_virtual(grid) else 0.0


@dataclass
class RunSession:
    """One run's shared state; :meth:`open` makes it from the settings (and checkpoint).

    Attributes
    ----------
    settings : RunSettings
        The run's tunables.
    task : Task
        What is learned.
    arrays : ArrayRecord
        The global model as it stands.
    strategy : StreamStrategy
        Plans and replies (with the run's controller and fleet registry).
    start : int
        The first round (asynchronous mode: model version) still to make.
    saved : dict
        What else the checkpoint held (an asynchronous run's buffer state).
    """

    settings: RunSettings
    task: Task
    arrays: ArrayRecord
    strategy: StreamStrategy
    start: int = 1
    saved: dict[str, Any] = field(default_factory=dict)
    _model: nn.Module | None = field(default=None, repr=False)  # scratch model for eval-data
    _held_out: ServerEvaluation | None = field(default=None, repr=False)
    _out: Path | None = field(default=None, repr=False)
    _started: float = field(default_factory=time.monotonic, repr=False)
    _stop: StopRequest | None = field(default=None, repr=False)
    _last: RoundRecord | None = field(default=None, repr=False)  # the last committed
    skipped: dict[str, int] = field(default_factory=dict)
    divergence: DivergenceWatch = field(default_factory=lambda: DivergenceWatch(0, 0.0))
    exports: ExportSchedule | None = field(default=None, repr=False)
    sinks: list[RoundSink] = field(default_factory=list)  # where rounds go besides metrics
    run_id: int | None = None  # Flower's, in each checkpoint (fedstream resume waits for it)

    @classmethod
    def open(
        cls, settings: RunSettings, task: Task | None = None, run_id: int | None = None
    ) -> RunSession:
        """Start a run, or resume it from ``checkpoint-dir`` when the settings ask; ``run_id``
        (Flower's) goes into each checkpoint.

        Raises
        ------
        ValueError
            If the checkpoint holds a model for another task, model, sample shape or
            class count, or a sink's library (TensorBoard, MLflow) is missing.
        OSError
            If the Prometheus port cannot be bound.
        """
        task = task or load_task(settings)
        learning = settings.learning
        model = init_model(task, learning.shape, learning.num_classes, settings.seed)
        arrays = ArrayRecord(model.state_dict())
        personal = run_personal_keys(model, learning)  # a bad pattern fails here, at start
        controller = BatchController(settings)
        fleet = FleetRegistry()
        start, saved = 1, {}
        ckpt = load_resume(settings.checkpoints, learning)
        if ckpt is not None:
            arrays = ckpt.arrays
            controller = BatchController.from_state_dict(ckpt.controller, settings)
            fleet.load_state_dict(ckpt.extra)
            start, saved = ckpt.server_round + 1, ckpt.extra
            num_rounds = settings.rounds.num_rounds
            if num_rounds and start > num_rounds:
                log.info("the checkpoint already holds all %d rounds: nothing to do", start - 1)
        out_dir = settings.metrics_log.out_dir
        out = Path(out_dir) if out_dir not in ("", NO_OUT_DIR) else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        session = cls(
            settings,
            task,
            arrays,
            StreamStrategy(
                settings,
                controller,
                fleet,
                unshared_keys(model, personal),
                Privacy.from_state(
                    settings.privacy,
                    settings.rounds.fraction_train,
                    saved.get(PRIVACY, {}),
                    start - 1,
                ),
            ),
            start,
            saved,
            _model=model,
            _held_out=ServerEvaluation.from_settings(
                settings.evaluation, learning, settings.seed, task
            ),
            _out=out,
            skipped={str(k): int(v) for k, v in saved.get(SKIPPED, {}).items()},
            divergence=DivergenceWatch(
                settings.rounds.max_diverged_rounds,
                learning.lr,
                int(saved.get(DIVERGED_ROUNDS, 0)),
            ),
            exports=ExportSchedule(settings.exports, learning, task, personal),
            run_id=run_id,
        )
        session.strategy.drift.load_state_dict(saved.get(DRIFT, {}))
        session.strategy.heterogeneity.load_state_dict(saved.get(HETEROGENEITY, {}))
        session.strategy.privacy.check_budget()  # a budget spent: refused before anything
        session.sinks = open_sinks(settings.sinks, settings.to_run_config())
        return session

    @property
    def diverged_rounds(self) -> int:
        """Rounds in a row, up to the last committed, in which training diverged."""
        return self.divergence.rounds

    def watch_stop(self) -> StopRequest:
        """The run's stop request (SIGTERM, SIGINT, a ``STOP`` file in ``checkpoint-dir`` or
        ``out-dir``): enter it around the rounds; :meth:`finished` consults it."""
        out_dir = self.settings.metrics_log.out_dir
        out = "" if out_dir == NO_OUT_DIR else out_dir
        self._stop = StopRequest([self.settings.checkpoints.checkpoint_dir, out])
        return self._stop

    def more_rounds(self, server_round: int) -> bool:
        """Whether round (asynchronous mode: version) ``server_round`` is still to make:
        always for a continuous run (``num-rounds = 0``) while the privacy budget
        (``dp-epsilon``) pays for it."""
        num_rounds = self.settings.rounds.num_rounds
        if num_rounds and server_round > num_rounds:
            return False
        privacy = self.strategy.privacy
        if not privacy.affordable():
            log.info(
                "privacy budget: round %d would spend epsilon %.3g, over dp-epsilon %g; "
                "the run ends here",
                server_round,
                privacy.spent(privacy.rounds + 1),
                self.settings.privacy.dp_epsilon,
            )
            return False
        return True

    def finished(
        self, record: RoundRecord, stop: Callable[[RoundRecord], bool] | None = None
    ) -> bool:
        """After ``record``'s round is committed: whether the run ends there (its last
        round, the caller's ``stop``, or a stop request)."""
        if not self.more_rounds(record.round + 1):
            return True
        if stop is not None and stop(record):
            return True
        reason = self._stop.requested() if self._stop is not None else None
        if reason is not None:
            directory = self.settings.checkpoints.checkpoint_dir
            log.info(
                "stopping after round %d (%s)%s",
                record.round,
                reason,
                f": resume = true continues from {directory}" if directory else "",
            )
            return True
        return False

    def skip_reason(self, report: RoundReport) -> str:
        """Why a round's update must not be applied ('' if it may): no device replied, or
        they trained on fewer than ``min-fresh-samples`` fresh samples in all (the
        buffers' samples are consumed by training, so fresh means not trained on before),
        ``diverged`` when training diverged on the others."""
        if report.secagg is not None and report.secagg.skipped:
            return report.secagg.skipped
        if self.settings.privacy.dp == "central":
            # Released every round, noised (PrivateMean): a rule that keeps the model when
            # few samples came would decide on the devices' data what the noise covers.
            return ""
        if not report.replies and not report.diverged:
            return "no-replies"
        if report.fresh_samples < self.settings.rounds.min_fresh_samples:
            return DIVERGED if report.diverged else "too-few-fresh-samples"
        return ""

    def finish(self) -> None:
        """At the end of a run: export the last committed model if the last export is
        older (``export-dir``)."""
        if self.exports is not None:
            self.exports.at_end(self._scratch, self.arrays, self._last)

    def close(self) -> None:
        """Close the sinks (however the run ended)."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def _scratch(self) -> nn.Module:
        if self._model is None:
            learning = self.settings.learning
            self._model = self.task.build_model(learning.shape, learning.num_classes)
        return self._model

    def probe(self, grid: Grid) -> RoundRecord | None:
        """Before the first round of a fresh run: time each device's steps so that the first
        plan follows its speed.

        Returns
        -------
        RoundRecord or None
            The probe's record (``round`` 0, appended to ``metrics.jsonl``): its wall time
            and its ``virtual-s``: on a virtual clock what the grid charged for it, so that
            a run's records sum to its time from 0; on Flower's grids the slowest device's
            probe compute (as a round's is its slowest reply's compute + wait + upload).
            None when no probe ran (a resumed run, the ``fixed`` controller,
            ``controller-probe`` 0).
        """
        if self.start != 1:
            return None
        timeouts = self.settings.exchange
        wait_for_nodes(grid, timeouts.min_nodes, timeouts.round_timeout)
        messages = self.strategy.configure_probe(grid)
        if not messages:
            return None
        t0, clock0 = time.monotonic(), virtual_time(grid)
        done = exchange(grid, messages, timeouts.round_timeout)
        probed = self.strategy.read_probe(done.replies, done.sent)
        wall = time.monotonic() - t0
        log.info("probed %d of %d devices' step times in %.1f s", len(probed), len(messages), wall)
        fleet = self.strategy.fleet
        record = RoundRecord(
            round=PROBE_ROUND,
            accuracy=math.nan,
            loss=math.nan,
            global_batch=self.settings.global_batch,
            sum_b=0,
            lr_scale=1.0,
            planned={},
            devices={},
            failed=dict(fleet.failed),
            rejected=dict(fleet.rejected),
            rejected_reasons=dict(fleet.rejected_reasons),
            compress="none",
            aggregation=self.settings.aggregation_rule.aggregation,
            aggregated=[],
            bytes_up=0,
            broadcast_bytes=0,
            inject_picked=[],
            inject_bytes=0,
            virtual_s=round(
                virtual_time(grid) - clock0
                if is_virtual(grid)
                else _probe_compute_s(done.replies, self.settings.controller_probe),
                6,
            ),
            wall_s=round(wall, 3),
            run_wall_s=round(time.monotonic() - self._started, 3),
            metric=self.task.metric,
            mode=self.settings.asynchrony.mode,
            latency={fleet.device_of(done.sent[i]): round(v, 3) for i, v in done.arrived.items()},
        )
        record = self._published(record)
        if self._out is not None:  # the rounds' sinks get rounds; the log gets every record
            append_record(self._out / METRICS_FILE, record)
        return record

    def charge_server(self, grid: Grid, updates: int) -> None:
        """On a virtual clock, charge the aggregator's own work after a round's (or an
        asynchronous aggregation's) replies: combining ``updates`` updates and, when the run
        has ``eval-data``, scoring the model on it. The in-process runner models their cost
        (:class:`deploy.inprocess.ServerCost`); the wall clock's grids take what they take.
        """
        charge = getattr(grid, "charge_server", None) if is_virtual(grid) else None
        if charge is None:
            return
        values = sum(math.prod(a.shape) for a in self.arrays.values())
        samples = 0 if self._held_out is None else len(self._held_out.y)
        charge(updates=updates, values=values, eval_samples=samples)

    def evaluate(self, arrays: ArrayRecord) -> Scores | None:
        """Score ``arrays`` on ``eval-data`` (None when the run has none)."""
        if self._held_out is None or self._model is None:
            return None
        self._model.load_state_dict(arrays.to_torch_state_dict())
        return self._held_out(self._model)

    def record(
        self,
        report: RoundReport,
        test: Scores | None,
        wall: float,
        virtual_s: float,
        **extra: Any,
    ) -> RoundRecord:
        """The round's (or aggregation's) line of ``metrics.jsonl``; ``extra``: the
        asynchronous mode's fields."""
        fleet, privacy = self.strategy.fleet, self.strategy.privacy
        devices = report.replies
        if privacy.on and not self.settings.privacy.dp_device_scores:
            # scores of one device's private samples, which no noise covers
            devices = {
                d: replace(m, eval_metric=math.nan, eval_loss=math.nan) for d, m in devices.items()
            }
        record = RoundRecord(
            round=report.server_round,
            accuracy=report.eval_metric,
            loss=report.eval_loss,
            eval_count=report.eval_count,
            test_accuracy=math.nan if test is None else test.metric,
            test_loss=math.nan if test is None else test.loss,
            metric=self.task.metric,
            higher_is_better=self.task.higher_is_better,
            test_by_group={}
            if test is None or self._held_out is None
            else self._held_out.by_group(test),
            global_batch=self.settings.global_batch,
            sum_b=report.sum_b,
            lr_scale=report.lr_scale,
            planned=report.planned,
            devices=devices,
            failed=dict(fleet.failed),
            rejected=dict(fleet.rejected),
            rejected_reasons=dict(fleet.rejected_reasons),
            compress=report.compress,
            aggregation=self.settings.aggregation_rule.aggregation,
            aggregated=sorted(report.aggregated),
            bytes_up=report.bytes_up,
            broadcast_bytes=report.broadcast_bytes,
            inject_picked=report.injectors,
            inject_bytes=report.inject_bytes,
            virtual_s=round(virtual_s, 6),
            wall_s=round(wall, 3),
            run_wall_s=round(time.monotonic() - self._started, 3),
            mode=self.settings.asynchrony.mode,
            updates=list(report.updates),
            drift=dict(report.drift),
            diverged=len(report.diverged),
            live=report.live,
            weight_ratio=report.weight_ratio,
            dp_epsilon_spent=privacy.spent() if privacy.on else None,
            dp_clip=report.dp_clip,
            dp_clipped_here=report.dp_clipped_here,
            **_secure_fields(report),
            **extra,
        )
        return self._published(record)

    def _published(self, record: RoundRecord) -> RoundRecord:
        """``record`` as the run publishes it: without the devices' identities and figures
        under differential privacy, unless ``dp-device-records`` (which the accountant then
        counts without amplification)."""
        private = self.settings.privacy
        if private.on and not private.dp_device_records:
            return record.without_devices()
        return record

    def commit(self, record: RoundRecord, arrays: ArrayRecord, **state: Any) -> RoundRecord:
        """Checkpoint ``arrays`` as of ``record``'s round (with ``state``: more to resume
        from), export them when due, then append the record to ``metrics.jsonl`` and give
        it to the sinks.

        Checkpoint first: a crash between the two leaves a round checkpointed but not in
        ``metrics.jsonl`` (a gap in a log), never a logged round that a resume runs again.
        The checkpoint's and the export's seconds are added to the record's ``timing`` and
        ``wall-s``.

        Returns
        -------
        RoundRecord
            ``record`` as appended.

        Raises
        ------
        RunDivergedError
            Once the record is appended, when training has diverged on some device in
            ``max-diverged-rounds`` rounds in a row.
        """
        self.arrays = arrays
        if record.skipped:
            self.skipped[record.skipped] = self.skipped.get(record.skipped, 0) + 1
            log.warning("round %d skipped (%s): the model is kept", record.round, record.skipped)
        diverged = self.divergence.count(bool(record.diverged))
        record = replace(record, skipped_rounds=dict(self.skipped), diverged_rounds=diverged)
        t0 = time.monotonic()
        self._checkpoint(record.round, arrays, state)
        t1 = time.monotonic()
        exported = self.exports.after_round(self._scratch, arrays, record) if self.exports else 0
        t2 = time.monotonic()
        record = replace(
            record,
            timing=replace(
                record.timing, checkpoint_s=round(t1 - t0, 4), export_s=round(t2 - t1, 4)
            ),
            wall_s=round(record.wall_s + t2 - t0, 3),
            run_wall_s=round(record.run_wall_s + t2 - t0, 3),
            exported=exported,
        )
        self._log(record)
        self._last = record
        self.divergence.check(record)
        return record

    def _checkpoint(self, server_round: int, arrays: ArrayRecord, state: dict[str, Any]) -> None:
        """The round's checkpoint, in ``checkpoint-dir`` (none without)."""
        directory = self.settings.checkpoints.checkpoint_dir
        if not directory:
            return
        save_round(
            directory,
            server_round,
            arrays,
            self.strategy.controller.state_dict(),
            self.strategy.fleet.state_dict(),
            self.settings.to_run_config(),
            {
                SKIPPED: dict(self.skipped),
                DIVERGED_ROUNDS: self.divergence.rounds,
                DRIFT: self.strategy.drift.state_dict(),
                PRIVACY: self.strategy.privacy.state_dict(),
                HETEROGENEITY: self.strategy.heterogeneity.state_dict(),
                **({} if self.run_id is None else {RUN_ID: self.run_id}),
                **state,
            },
        )

    def _log(self, record: RoundRecord) -> None:
        """Append ``record`` to ``metrics.jsonl`` (rotated past ``metrics-max-mb``) and give
        it to the sinks."""
        if self._out is not None:
            rotation = self.settings.metrics_log
            append_record(
                self._out / METRICS_FILE,
                record,
                max_bytes=int(rotation.metrics_max_mb * 1e6),
                keep=rotation.metrics_keep,
            )
        write_all(self.sinks, record)


def _secure_fields(report: RoundReport) -> dict[str, Any]:
    """A round's secure-aggregation fields of its record (none without it)."""
    figures = report.secagg
    if figures is None:
        return {}
    return {
        "secagg_survivors": figures.survivors,
        "secagg_dropped": figures.dropped,
        "secagg_bytes_up": figures.bytes_up,
        "secagg_bytes_down": figures.bytes_down,
        "secagg_device_cpu_s": round(figures.device_cpu_s, 4),
        "secagg_unmask_s": round(figures.unmask_s, 4),
    }


def _probe_compute_s(replies: Iterable[Message], steps: int) -> float:
    """The slowest device's probe compute among ``replies`` (0 when none answered)."""
    slowest = 0.0
    for msg in replies:
        if msg.has_error():
            continue
        try:
            slowest = max(slowest, ProbeReply.from_content(msg.content).compute_s(steps))
        except RecordError:
            continue
    return slowest
