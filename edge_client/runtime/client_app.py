"""The fedstream ClientApp: one Flower message = one round of training from the buffer (or,
once before the first round, a timing probe: a ``query`` message).

Flower 1.42 starts a fresh process per message, so everything that must outlive a round
lives in the device's buffer file (samples fed by ``fedstream ingest``, the device state,
the outbox) or comes in the message. The node says which device it is
(:class:`~edge_client.runtime.node_config.NodeConfig`); the run config says which model
(:class:`~edge_client.wire.run_config.RunSettings`); the message brings the global model and
the device's :class:`~edge_client.wire.records.RoundPlan`. The reply is a
:class:`~edge_client.wire.records.DeviceReply`.

In Flower's simulation engine a node has only ``partition-id``: it becomes a virtual device
fed by a replayed stream (:mod:`edge_client.emulation.simulation`, imported only there, so a
real device never loads the stream emulation).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import PARTITION_ID_KEY

from edge_client.runtime.buffer import BufferStore
from edge_client.runtime.device_state import DeviceStateStore
from edge_client.runtime.inject import inject_pool_path, share
from edge_client.runtime.node_config import NodeConfig
from edge_client.runtime.seeding import device_rng
from edge_client.runtime.trainer import pick_device, probe_step_times, train_local
from edge_client.task.models import build_model
from edge_client.wire.codec import compress, encode
from edge_client.wire.records import (
    ARRAYS,
    CONFIG,
    DeviceReply,
    ProbePlan,
    ProbeReply,
    ReplyMetrics,
    RoundPlan,
)
from edge_client.wire.run_config import RunSettings

__all__ = ["app", "probe", "train"]

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train this round's plan on the device's buffer and reply with the model delta."""
    settings = RunSettings.from_run_config(context.run_config)
    node = _node(context, settings)
    if node.threads > 0:
        torch.set_num_threads(node.threads)
    plan = RoundPlan.from_record(msg.content.config_records[CONFIG])
    with BufferStore(node.buffer) as store:
        model = build_model(
            settings.model, store.shape, settings.num_classes, width=settings.model_width
        )
        received = msg.content.array_records[ARRAYS].to_torch_state_dict()
        model.load_state_dict({k: v.float() for k, v in received.items()})  # fp16 broadcast too
        start = _numpy_state(model)
        rng = device_rng(int(context.run_id) % 2**32, node.device_id, plan.server_round)
        pool_path = inject_pool_path(node.buffer)
        with contextlib.ExitStack() as stack:
            pool = (
                stack.enter_context(BufferStore(pool_path))
                if node.inject and plan.inject_mix > 0 and pool_path.exists()
                else None
            )
            result = train_local(
                model, store, plan, slowdown=node.slowdown, device=pick_device(), pool=pool, rng=rng
            )
        delta = {k: v - start[k] for k, v in _numpy_state(model).items()}
        with DeviceStateStore(node.buffer) as state:
            frame, gap = _encode(state, context.run_id, delta, plan, result.num_examples > 0)
        shared = (0, 0)
        if node.inject and plan.inject_publish and result.taken is not None:
            shared = share(node.buffer, node.device_id, result.taken, plan, rng)
        buffer = store.stats()
    metrics = ReplyMetrics(
        num_examples=result.num_examples,
        batch_size=result.batch_size,
        local_steps=result.local_steps,
        compute_s=result.compute_s,
        step_s=result.step_s,
        wait_s=result.wait_s,
        train_loss=result.train_loss,
        lr=result.lr,
        stream_rate=float(buffer["rate"]),
        buffer_fill=int(buffer["fill"]),
        buffer_dropped=int(buffer["dropped"]),
        bytes_up=len(frame),
        compress_gap=gap,
        inject_used=result.inject_used,
        inject_opt_in=int(node.inject),
        inject_bytes=shared[0],
        inject_samples=shared[1],
    )
    return Message(DeviceReply(node.device_id, metrics, frame).to_content(), reply_to=msg)


@app.query()
def probe(msg: Message, context: Context) -> Message:
    """Time SGD steps of the run's model at the probe's batch sizes (the controller's first
    timings); reply with :class:`~edge_client.wire.records.ProbeReply`."""
    settings = RunSettings.from_run_config(context.run_config)
    node = _node(context, settings)
    if node.threads > 0:
        torch.set_num_threads(node.threads)
    probe_plan = ProbePlan.from_record(msg.content.config_records[CONFIG])
    with BufferStore(node.buffer) as store:
        shape = store.shape
    model = build_model(settings.model, shape, settings.num_classes, width=settings.model_width)
    step_s = probe_step_times(
        model,
        shape,
        settings.num_classes,
        probe_plan.batches,
        probe_plan.steps,
        slowdown=node.slowdown,
        device=pick_device(),
    )
    reply = ProbeReply(node.device_id, probe_plan.batches, step_s)
    return Message(reply.to_content(), reply_to=msg)


def _node(context: Context, settings: RunSettings) -> NodeConfig:
    """This node's device: from its node config, or a virtual one in the simulation engine
    (a node with only Flower's ``partition-id``)."""
    node = context.node_config
    if NodeConfig.given_in(node) or PARTITION_ID_KEY not in node:
        return NodeConfig.from_node_config(node)
    from edge_client.emulation.simulation import simulated_node  # the simulation engine only

    return simulated_node(context.node_config, context.run_id, settings)


def _numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _encode(
    state: DeviceStateStore,
    run_id: int,
    delta: dict[str, np.ndarray],
    plan: RoundPlan,
    trained: bool,
) -> tuple[bytes, float | None]:
    """Code the delta with the device's error-feedback state (kept in the buffer file).

    A round that trained nothing sends a zero delta and leaves the state alone (the server
    gives it no weight, so a residual spent on it would be lost).
    """
    feedback = state.feedback(run_id, delta)
    if not trained:
        return encode(delta, "none"), feedback.gap
    packed = compress(delta, feedback, plan.compress, plan.compress_ratio)
    state.save_feedback(run_id, packed.state)
    return packed.frame, packed.state.gap
