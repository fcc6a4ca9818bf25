"""One round of fedstream's ClientApp, in the process that runs it: the ClientApp's own
process (Flower's per-message ``flwr-clientapp``, or the simulation engine's worker) or the
device's agent (:mod:`~edge_client.runtime.agent`), which keeps torch and the task loaded
between messages.

:func:`train_round` evaluates the received model on the round's samples (prequential), trains
the device's plan on them and replies with the coded delta; :func:`probe_steps` times SGD
steps for the controller's first plan. Everything that must outlive a round lives in the
device's buffer file (samples, device state, outbox) or comes in the message.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode

from edge_client.runtime.buffer import SampleBuffer
from edge_client.runtime.device_open import node_of, open_device
from edge_client.runtime.device_state import DeviceState
from edge_client.runtime.drift_watch import errors_of
from edge_client.runtime.injection import round_pool, share_when_picked
from edge_client.runtime.model_store import store_model
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.secure_stages import prepare_input, weight_of
from edge_client.runtime.seeding import device_rng
from edge_client.runtime.trainer import (
    TrainResult,
    diverged,
    pick_device,
    probe_step_times,
    train_local,
)
from edge_client.runtime.usage import cpu_s, disk_write_bytes, peak_rss_bytes, process_age_s
from edge_client.runtime.virtual_nodes import VirtualNodes, is_virtual, virtual_nodes
from edge_client.task.interface import Scores, Task
from edge_client.task.loading import load_task
from edge_client.task.personal import run_personal_keys, unshared_keys
from edge_client.task.preprocess import Preprocessor
from edge_client.wire.codec import compress, encode
from edge_client.wire.records import (
    ARRAYS,
    CONFIG,
    PLAN_REFUSED,
    DeviceReply,
    ProbePlan,
    ProbeReply,
    ReplyMetrics,
    RoundPlan,
    unpack_model,
)
from edge_client.wire.run_config import RunSettings
from edge_client.wire.secagg_records import ADVERT

__all__ = ["probe_steps", "received_model", "train_round"]

log = logging.getLogger(__name__)


def train_round(msg: Message, context: Context, task: Task | None = None) -> Message:
    """One round: prequential evaluation and training on the device's buffer, the reply.

    A buffer that holds samples of another shape than the run's ``sample-shape`` is not
    touched: the reply carries the buffer's shape, no update, and the aggregator leaves
    the device out.
    """
    entered, start_s = time.perf_counter(), process_age_s()
    plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
    settings, task, node = _prepare(context, task, plan.server_round)
    refusal = node.plan_refusal(plan.dp_noise, plan.dp_clip, bool(plan.secagg_weighting))
    if refusal:  # before a sample is taken: the plan is the aggregator's, the floor the owner's
        log.warning("device %s refused round %d: %s", node.device_id, plan.server_round, refusal)
        error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{PLAN_REFUSED}: {refusal}")
        return Message(error, reply_to=msg)
    with open_device(context, settings, node, plan.server_round) as (store, state):
        if store.shape != settings.shape:
            return _shape_mismatch(msg, node.device_id, store, settings.shape)
        store.restore_taken()  # a round that died before its reply gives its samples back
        model = task.build_model(settings.shape, settings.num_classes)
        arrays = msg.content.array_records[ARRAYS]
        received = unpack_model(arrays, model.state_dict(), plan.model_layout)  # float32
        model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()})
        personal = _overlay_personal(model, settings, state)
        unshared = unshared_keys(model, personal)
        start = _numpy_state(model)
        rng = device_rng(settings.seed, node.device_id, plan.server_round)  # a seeded run repeats
        preprocessor = task.preprocessor()
        if preprocessor is not None:
            state.load_preprocessor(preprocessor)
        if is_virtual(context):  # no broker: what others shared arrives now
            virtual_nodes().receive_shared(node, settings, state, plan.server_round)
        device = pick_device()
        with round_pool(node, plan) as pool:
            setup_s = time.perf_counter() - entered
            result = train_local(
                model,
                store,
                plan,
                task=task,
                preprocessor=preprocessor,
                slowdown=node.slowdown,
                device=device,
                pool=pool,
                rng=rng,
            )
            trained = time.perf_counter()  # closing the pool is the reply's part
        if is_virtual(context):  # its steps' cost on the virtual clock, not Ray's wall time
            result = _charged(result, virtual_nodes(), node)
        trained_state = _numpy_state(model)
        # personal tensors stay on the device, kept in its state; counters stay too
        delta = {k: v - start[k] for k, v in trained_state.items() if k not in unshared}
        if personal and result.num_examples > 0:
            state.save_personal({k: trained_state[k] for k in personal})
        if node.model_dir:  # the received model, for inference (fedstream infer)
            store_model(
                node.model_dir,
                task,
                settings,
                start,
                plan.server_round - 1,
                node.device_id,
                result.evaluated,
            )
        broke = _diverged(state, context.run_id, result, delta, node.device_id)
        advert = None
        if plan.secagg_weighting:  # masked in the stages that follow: no frame now
            frame, gap, within = b"", None, True
            if not broke and result.num_examples > 0:
                weight = weight_of(plan, result.num_examples, result.local_steps)
                advert = prepare_input(
                    state, context.run_id, plan, delta, weight, rng, node.secagg_min_peers
                )
        else:
            frame, gap, within = (
                (b"", None, True)  # no update: the aggregator refuses it, counted as diverged
                if broke
                else _encode(state, context.run_id, delta, plan, result.num_examples > 0)
            )
        _keep_round_state(state, node, task, result, preprocessor)
        post = virtual_nodes().post_shared(node, plan.server_round) if is_virtual(context) else None
        shared = share_when_picked(node, plan, result.taken, rng, state, post)
        store.settle_taken()  # the reply is ready: its samples are spent
        buffer = store.stats()
    done = time.perf_counter()
    timing = _Timing(start_s, setup_s, done - trained, done - entered)
    coded = _Coded(frame, gap, within, shared)
    noised = plan.dp_noise > 0  # local DP: the device noises its update itself
    metrics = _reply_metrics(result, buffer, settings, node, coded, timing, broke, noised)
    content = DeviceReply(node.device_id, metrics, frame).to_content()
    if advert is not None:
        content[ADVERT] = advert.to_record()
    return Message(content, reply_to=msg)


def _overlay_personal(
    model: torch.nn.Module, settings: RunSettings, state: DeviceState
) -> frozenset[str]:
    """Put the device's personal tensors (``personalize``, ``personal-layers``) on the
    received model, where it has them (its first round keeps the received ones); return
    their keys (empty without personalisation)."""
    personal = run_personal_keys(model, settings.learning)
    if personal:
        received = model.state_dict()
        kept = state.personal({k: received[k].numpy() for k in personal})
        if kept is not None:
            model.load_state_dict({k: torch.from_numpy(v) for k, v in kept.items()}, strict=False)
    return personal


def _charged(result: TrainResult, virtual: VirtualNodes, node: NodeConfig) -> TrainResult:
    """A virtual device's round with its compute as the virtual clock charges it; the
    clock charges no scoring, so none is reported (the controller would take wall seconds
    for it)."""
    if result.batch_size <= 0:
        return replace(result, eval_s=0.0)
    timings = tuple((b, virtual.step_s(node, b)) for b, _ in result.step_timings)
    step_s = (
        sum(t for _, t in timings) / len(timings)
        if timings
        else virtual.step_s(node, result.batch_size)
    )
    return replace(
        result,
        step_s=step_s,
        compute_s=step_s * result.local_steps,
        step_timings=timings,
        eval_s=0.0,
    )


@dataclass(frozen=True)
class _Timing:
    """Where a round's handler spent its time, beyond training (seconds)."""

    start_s: float  # the process's age when the handler began
    setup_s: float  # from the handler's start to training's
    encode_s: float  # from the end of training to the reply
    handler_s: float  # the handler in all


@dataclass(frozen=True)
class _Coded:
    """What left the device with the reply besides training's figures."""

    frame: bytes  # the update frame (empty: no update)
    gap: float | None  # the top-k gap EWMA, once known
    within_clip: bool  # the update needed no clipping (under a plan's dp-clip)
    shared: tuple[int, int]  # bytes and samples queued for injection


def _keep_round_state(
    state: DeviceState,
    node: NodeConfig,
    task: Task,
    result: TrainResult,
    preprocessor: Preprocessor | None,
) -> None:
    """Keep what the next round starts from: the preprocessor's statistics (when samples
    were trained on) and the drift watcher (``drift = "adwin"``)."""
    if preprocessor is not None and result.num_examples > 0:
        state.save_preprocessor(preprocessor)
    if node.drift == "adwin" and result.evaluated is not None:
        _watch_drift(state, node.drift_delta, task, result.evaluated)


def _reply_metrics(
    result: TrainResult,
    buffer: dict[str, Any],
    settings: RunSettings,
    node: NodeConfig,
    coded: _Coded,
    timing: _Timing,
    broke: bool,
    noised: bool = False,
) -> ReplyMetrics:
    """The reply's metrics: what training did, the buffer, the update's size, injection,
    the prequential scores, the handler's timing and the process's costs.

    Under local differential privacy (``noised``: the plan had the device noise its
    update) nothing else computed on its samples leaves the device: not the training loss,
    nor whether the update was within the clip, nor the scores (those unless
    ``dp-device-scores`` and the device's owner set no floor of its own, ``dp-min-noise``):
    an aggregator it does not trust gets the noised update only.
    """
    private = settings.privacy
    local = noised or private.dp == "local"
    keep_scores = private.dp_device_scores and node.dp_min_noise == 0
    scores = None if local and not keep_scores else result.evaluated
    return ReplyMetrics(
        num_examples=result.num_examples,
        batch_size=result.batch_size,
        local_steps=result.local_steps,
        compute_s=result.compute_s,
        step_s=result.step_s,
        step_batches=[b for b, _ in result.step_timings] or None,
        step_times=[t for _, t in result.step_timings] or None,
        wait_s=result.wait_s,
        train_loss=math.nan if noised else result.train_loss,
        lr=result.lr,
        **_buffer_metrics(buffer),
        bytes_up=len(coded.frame),
        compress_gap=coded.gap,
        inject_used=result.inject_used,
        fresh_samples=result.fresh,
        inject_opt_in=int(node.inject),
        inject_bytes=coded.shared[0],
        inject_samples=coded.shared[1],
        dp_within_clip=0 if noised else int(coded.within_clip),
        eval_metric=scores.metric if scores else math.nan,
        eval_loss=scores.loss if scores else math.nan,
        eval_count=scores.count if scores else 0,
        eval_s=result.eval_s,
        sample_shape=list(settings.shape),
        start_s=timing.start_s,
        setup_s=timing.setup_s,
        take_s=result.take_s,
        train_s=result.train_s,
        encode_s=timing.encode_s,
        handler_s=timing.handler_s,
        cpu_s=cpu_s(reaped=False),
        peak_rss=peak_rss_bytes(),
        write_bytes=disk_write_bytes(),
        drift_changes=int((buffer.get("drift") or {}).get("changes", 0)),
        train_diverged=int(broke),
    )


def probe_steps(msg: Message, context: Context, task: Task | None = None) -> Message:
    """Time SGD steps of the run's model at the probe's batch sizes, on random inputs of
    the run's ``sample-shape``; reply with :class:`~edge_client.wire.records.ProbeReply`."""
    settings, task, node = _prepare(context, task)
    probe_plan = ProbePlan.from_record(msg.content.config_records[CONFIG])
    if is_virtual(context):  # on the virtual clock: nothing to time
        step_s = [virtual_nodes().step_s(node, b) for b in probe_plan.batches]
    else:
        step_s = probe_step_times(
            task.build_model(settings.shape, settings.num_classes),
            settings.shape,
            settings.num_classes,
            probe_plan.batches,
            probe_plan.steps,
            task=task,
            slowdown=node.slowdown,
            device=pick_device(),
        )
    reply = ProbeReply(node.device_id, probe_plan.batches, step_s)
    return Message(reply.to_content(), reply_to=msg)


def _shape_mismatch(
    msg: Message, device_id: str, store: SampleBuffer, expected: tuple[int, ...]
) -> Message:
    """The reply of a device whose buffer holds samples of another shape: no update, its
    buffer's shape, its samples left where they are."""
    log.warning(
        "device %s: the buffer holds samples of shape %s, the run expects %s: not training "
        "(set sample-shape, or ingest with --shape)",
        device_id,
        store.shape,
        expected,
    )
    buffer = store.stats()
    metrics = ReplyMetrics(
        num_examples=0,
        batch_size=0,
        step_s=0.0,
        train_loss=math.nan,
        **_buffer_metrics(buffer),
        sample_shape=list(store.shape),
    )
    return Message(DeviceReply(device_id, metrics, b"").to_content(), reply_to=msg)


def received_model(msg: Message, context: Context, task: Task | None = None) -> dict[str, Any]:
    """The global model a train message carries, by tensor name (float32 numpy arrays),
    unpacked by the run's model (for a ClientApp of one's own around :func:`train_round`)."""
    settings = RunSettings.from_run_config(context.run_config)
    task = task or load_task(settings)
    like = task.build_model(settings.shape, settings.num_classes).state_dict()
    plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
    return unpack_model(msg.content.array_records[ARRAYS], like, plan.model_layout)


def _prepare(
    context: Context, task: Task | None, server_round: int = 0
) -> tuple[RunSettings, Task, NodeConfig]:
    """A handler's run settings, task (the app's, or the one the run config names) and
    device (a virtual one as of ``server_round``), with torch's threads set as the node
    says."""
    settings = RunSettings.from_run_config(context.run_config)
    task = task or load_task(settings)
    node = node_of(context, settings, server_round)
    if node.threads > 0:
        torch.set_num_threads(node.threads)
    return settings, task, node


def _buffer_metrics(buffer: dict[str, Any]) -> dict[str, Any]:
    """The reply's figures of the device's buffer, from its ``stats()``."""
    return {
        "stream_rate": float(buffer["rate"]),
        "buffer_fill": int(buffer["fill"]),
        "buffer_dropped": int(buffer["dropped"]),
    }


def _watch_drift(state: DeviceState, delta: float, task: Task, scores: Scores) -> None:
    """Feed the round's prequential errors, sample by sample, to the device's drift watcher
    (River is imported here: about 1-3 s per round, so only with ``drift = "adwin"``)."""
    if scores.values is None or not len(scores.values):
        return
    watch = state.drift_watch(delta)
    if watch.update(errors_of(scores.values, task.higher_is_better)):
        log.warning("drift: the prequential error rose (%d changes so far)", watch.status.changes)
    state.save_drift_watch(watch)


def _diverged(
    state: DeviceState,
    run_id: int,
    result: TrainResult,
    delta: dict[str, np.ndarray],
    device_id: str,
) -> bool:
    """Whether this round's training diverged (:func:`~edge_client.runtime.trainer.diverged`,
    or an update that is not finite), against the first loss the device measured in the run
    (kept in its state: the first round it trains in sets it)."""
    if result.num_examples <= 0:
        return False
    first = state.first_loss(run_id)
    if first is None and math.isfinite(result.first_loss) and result.first_loss > 0:
        first = result.first_loss
        state.save_first_loss(run_id, first)
    finite = all(np.isfinite(v).all() for v in delta.values())
    if finite and not diverged(result.train_loss, first):
        return False
    log.warning(
        "device %s: training diverged (loss %.4g, the first %s): no update sent; lower lr "
        "or standardise the inputs",
        device_id,
        result.train_loss,
        "unknown" if first is None else f"{first:.4g}",
    )
    return True


def _numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _encode(
    state: DeviceState,
    run_id: int,
    delta: dict[str, np.ndarray],
    plan: RoundPlan,
    trained: bool,
) -> tuple[bytes, float | None, bool]:
    """Code the delta with the device's error-feedback state (kept in the buffer file):
    the frame, the top-k gap EWMA, and whether the update was within the plan's clip.

    A round that trained nothing sends a zero delta and leaves the state alone (the server
    gives it no weight, so a residual spent on it would be lost).
    """
    feedback = state.feedback(run_id, delta)
    if not trained:
        return encode(delta, "none"), feedback.gap, True
    # Under differential privacy: clipped (and, local DP, noised) after error feedback
    packed = compress(
        delta, feedback, plan.compress, plan.compress_ratio, plan.dp_clip, plan.dp_noise
    )
    state.save_feedback(run_id, packed.state)
    return packed.frame, packed.state.gap, packed.within_clip
