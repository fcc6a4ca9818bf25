"""A run as the ServerApp drives it, in either mode: what is learned, the model and the state
it starts or resumes from, the timing probe, evaluation on ``eval-data``, and after each
round (or asynchronous aggregation) the checkpoint and the line of ``metrics.jsonl``.

The synchronous round loop (:mod:`aggregator.server_app`) and the asynchronous one
(:mod:`aggregator.asynchronous`) differ in how they exchange messages and combine updates;
everything else they share is here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from torch import nn

from aggregator.checkpoint import RUN_CONFIG, Checkpoint, load_checkpoint, save_checkpoint
from aggregator.controller import BatchController
from aggregator.device_registry import FleetRegistry
from aggregator.exchange import exchange, wait_for_nodes
from aggregator.exports import export_model
from aggregator.round_log import (
    METRICS_FILE,
    RoundRecord,
    append_record,
    divergence_hint,
    runs_home,
)
from aggregator.server_eval import ServerEvaluation
from aggregator.sinks import RoundSink, open_sinks, write_all
from aggregator.stopping import StopRequest
from aggregator.strategy import DIVERGED, RoundReport, StreamStrategy
from edge_client.task.interface import Scores, Task, init_model
from edge_client.task.loading import load_task
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import RunSettings, parse_shape, upgrade_saved

__all__ = [
    "MODEL_SETTINGS",
    "NO_OUT_DIR",
    "RECORDS_KEPT",
    "RunDivergedError",
    "RunSession",
    "is_virtual",
    "virtual_time",
    "with_run_dir",
]

log = logging.getLogger(__name__)

#: Settings a checkpoint's model depends on: a resume must not change them.
MODEL_SETTINGS = ("task", "model", "model_width", "sample_shape", "num_classes")
#: Records a run returns at most (a continuous run's are in metrics.jsonl, not in memory).
RECORDS_KEPT = 1000
#: Keys of the skipped rounds per reason, the drift reaction's state, and the rounds in a
#: row in which training diverged, in a checkpoint.
SKIPPED = "skipped-rounds"
DRIFT = "drift"
DIVERGED_ROUNDS = "diverged-rounds"
#: ``out-dir`` for a run that writes no ``metrics.jsonl`` at all.
NO_OUT_DIR = "none"


class RunDivergedError(RuntimeError):
    """The run ended because training diverged on its devices in ``max-diverged-rounds``
    rounds in a row (raised from the ServerApp: Flower marks the run failed)."""


def with_run_dir(settings: RunSettings, run_id: int) -> RunSettings:
    """``settings`` of a run Flower started: an empty ``out-dir`` becomes the run's default
    folder (:func:`~aggregator.round_log.runs_home` / ``run_id``), and ``none`` no folder."""
    if settings.out_dir == NO_OUT_DIR:
        return replace(settings, out_dir="")
    if settings.out_dir:
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
    _exported: int = field(default=0, repr=False)  # the last version exported
    _last: RoundRecord | None = field(default=None, repr=False)  # the last committed
    skipped: dict[str, int] = field(default_factory=dict)
    diverged_rounds: int = 0  # rounds in a row, up to the last committed, that diverged
    sinks: list[RoundSink] = field(default_factory=list)  # where rounds go besides metrics

    @classmethod
    def open(cls, settings: RunSettings, task: Task | None = None) -> RunSession:
        """Start a run, or resume it from ``checkpoint-dir`` when the settings ask.

        Raises
        ------
        ValueError
            If the checkpoint holds a model for another task, model, sample shape or
            class count, or a sink's library (TensorBoard, MLflow) is missing.
        OSError
            If the Prometheus port cannot be bound.
        """
        task = task or load_task(settings)
        model = init_model(task, settings.shape, settings.num_classes, settings.seed)
        arrays = ArrayRecord(model.state_dict())
        controller = BatchController(settings)
        fleet = FleetRegistry()
        start, saved = 1, {}
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
            start, saved = ckpt.server_round + 1, ckpt.extra
            log.info("resuming after round %d from %s", ckpt.server_round, settings.checkpoint_dir)
            if settings.num_rounds and start > settings.num_rounds:
                log.info("the checkpoint already holds all %d rounds: nothing to do", start - 1)
        out = Path(settings.out_dir) if settings.out_dir not in ("", NO_OUT_DIR) else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        session = cls(
            settings,
            task,
            arrays,
            StreamStrategy(settings, controller, fleet),
            start,
            saved,
            model,
            ServerEvaluation.from_settings(settings, task),
            out,
        )
        session.skipped = {str(k): int(v) for k, v in saved.get(SKIPPED, {}).items()}
        session.diverged_rounds = int(saved.get(DIVERGED_ROUNDS, 0))
        session.strategy.drift.load_state_dict(saved.get(DRIFT, {}))
        session.sinks = open_sinks(settings)
        return session

    def watch_stop(self) -> StopRequest:
        """The run's stop request (SIGTERM, SIGINT, a ``STOP`` file in ``checkpoint-dir`` or
        ``out-dir``): enter it around the rounds; :meth:`finished` consults it."""
        out = "" if self.settings.out_dir == NO_OUT_DIR else self.settings.out_dir
        self._stop = StopRequest([self.settings.checkpoint_dir, out])
        return self._stop

    def more_rounds(self, server_round: int) -> bool:
        """Whether round (asynchronous mode: version) ``server_round`` is still to make:
        always for a continuous run (``num-rounds = 0``)."""
        return self.settings.num_rounds == 0 or server_round <= self.settings.num_rounds

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
            log.info(
                "stopping after round %d (%s)%s",
                record.round,
                reason,
                f": resume = true continues from {self.settings.checkpoint_dir}"
                if self.settings.checkpoint_dir
                else "",
            )
            return True
        return False

    def skip_reason(self, report: RoundReport) -> str:
        """Why a round's update must not be applied ('' if it may): no device replied, or
        they trained on fewer than ``min-fresh-samples`` fresh samples in all (the
        buffers' samples are consumed by training, so fresh means not trained on before),
        ``diverged`` when training diverged on the others."""
        if not report.replies and not report.diverged:
            return "no-replies"
        if report.num_examples < self.settings.min_fresh_samples:
            return DIVERGED if report.diverged else "too-few-fresh-samples"
        return ""

    def finish(self) -> None:
        """At the end of a run: export the last committed model if the last export is
        older (``export-dir``)."""
        last = self._last
        if last is not None and self.settings.export_dir and self._exported < last.round:
            export_model(self.task, self.settings, self._scratch(), self.arrays, last)
            self._exported = last.round

    def close(self) -> None:
        """Close the sinks (however the run ended)."""
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def _scratch(self) -> nn.Module:
        if self._model is None:
            self._model = self.task.build_model(self.settings.shape, self.settings.num_classes)
        return self._model

    def probe(self, grid: Grid) -> None:
        """Before the first round of a fresh run: time each device's steps so that the first
        plan follows its speed."""
        if self.start != 1:
            return
        s = self.settings
        wait_for_nodes(grid, s.min_nodes, s.round_timeout)
        messages = self.strategy.configure_probe(grid)
        if not messages:
            return
        t0 = time.monotonic()
        done = exchange(grid, messages, s.round_timeout)
        probed = self.strategy.read_probe(done.replies, done.sent)
        log.info(
            "probed %d of %d devices' step times in %.1f s",
            len(probed),
            len(messages),
            time.monotonic() - t0,
        )

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
        fleet = self.strategy.fleet
        return RoundRecord(
            round=report.server_round,
            accuracy=report.eval_metric,
            loss=report.eval_loss,
            eval_count=report.eval_count,
            test_accuracy=math.nan if test is None else test.metric,
            test_loss=math.nan if test is None else test.loss,
            metric=self.task.metric,
            global_batch=self.settings.global_batch,
            sum_b=report.sum_b,
            lr_scale=report.lr_scale,
            planned=report.planned,
            devices=report.replies,
            failed=dict(fleet.failed),
            rejected=dict(fleet.rejected),
            rejected_reasons=dict(fleet.rejected_reasons),
            compress=report.compress,
            aggregation=self.settings.aggregation,
            aggregated=sorted(report.aggregated),
            bytes_up=report.bytes_up,
            broadcast_bytes=report.broadcast_bytes,
            inject_picked=report.injectors,
            inject_bytes=report.inject_bytes,
            virtual_s=round(virtual_s, 6),
            wall_s=round(wall, 3),
            run_wall_s=round(time.monotonic() - self._started, 3),
            mode=self.settings.mode,
            updates=list(report.updates),
            drift=dict(report.drift),
            diverged=len(report.diverged),
            **extra,
        )

    def commit(self, record: RoundRecord, arrays: ArrayRecord, **state: Any) -> RoundRecord:
        """Checkpoint ``arrays`` as of ``record``'s round (with ``state``: more to resume
        from), then append the record to ``metrics.jsonl``.

        Checkpoint first: a crash between the two leaves a round checkpointed but not in
        ``metrics.jsonl`` (a gap in a log), never a logged round that a resume runs again.
        The checkpoint's seconds are added to the record's ``timing`` and ``wall-s``.

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
        s = self.settings
        if record.skipped:
            self.skipped[record.skipped] = self.skipped.get(record.skipped, 0) + 1
            log.warning("round %d skipped (%s): the model is kept", record.round, record.skipped)
        self.diverged_rounds = self.diverged_rounds + 1 if record.diverged else 0
        record = replace(
            record, skipped_rounds=dict(self.skipped), diverged_rounds=self.diverged_rounds
        )
        t0 = time.monotonic()
        if s.checkpoint_dir:
            fleet = self.strategy.fleet
            save_checkpoint(
                s.checkpoint_dir,
                Checkpoint(
                    record.round,
                    arrays,
                    self.strategy.controller.state_dict(),
                    {
                        **fleet.state_dict(),
                        RUN_CONFIG: s.to_run_config(),
                        SKIPPED: dict(self.skipped),
                        DIVERGED_ROUNDS: self.diverged_rounds,
                        DRIFT: self.strategy.drift.state_dict(),
                        **state,
                    },
                ),
            )
        t1 = time.monotonic()
        exported = 0
        if s.export_dir and s.export_every and record.round % s.export_every == 0:
            exported = export_model(self.task, s, self._scratch(), arrays, record).version
            self._exported = exported
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
        if self._out is not None:
            append_record(
                self._out / METRICS_FILE,
                record,
                max_bytes=int(s.metrics_max_mb * 1e6),
                keep=s.metrics_keep,
            )
        write_all(self.sinks, record)
        self._last = record
        self._check_divergence(record)
        return record

    def _check_divergence(self, record: RoundRecord) -> None:
        """Log a round in which training diverged on some device, in one line; end the run
        once ``max-diverged-rounds`` such rounds came in a row.

        Raises
        ------
        RunDivergedError
            When the limit is reached (never with ``max-diverged-rounds = 0``).
        """
        if not record.diverged:
            return
        what = "version" if record.mode == "async" else "round"
        hint = divergence_hint(self.settings.lr)
        log.warning("%s %d: %s: %s", what, record.round, record.divergence(), hint)
        limit = self.settings.max_diverged_rounds
        if limit and self.diverged_rounds >= limit:
            raise RunDivergedError(
                f"training diverged in {self.diverged_rounds} {what}s in a row "
                f"(max-diverged-rounds = {limit}); in {what} {record.round}, "
                f"{record.divergence()}: {hint}"
            )


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
