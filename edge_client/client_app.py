"""The fedstream ClientApp: one Flower message = one round of training from the buffer.

Flower 1.42 starts a fresh process per message, so everything that must outlive a round
lives in the buffer store (fed by ``fedstream ingest``) or comes in the message.

Node config (``flower-supernode --node-config``): ``device-id`` (required), ``buffer``
(path of the device's buffer file, required), ``slowdown`` (>= 1, emulates a slower device),
``threads`` (torch intra-op threads; 0 leaves torch's default).

In Flower's simulation engine a node has only ``partition-id``: it becomes the virtual
device ``sim-<partition-id>`` whose buffer a replayed stream fills (``edge_client.replay``)
at the rate and with the slowdown given by the run config's ``sim-rates`` and
``sim-slowdowns`` lists.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from edge_client.buffer import BufferStore, inject_pool_path
from edge_client.codec import CodecError, FeedbackState, compress, decode, encode
from edge_client.constants import DEFAULT_CAPACITY, DEFAULT_NUM_CLASSES, INJECT_MAX_PAYLOAD_BYTES
from edge_client.frames import SampleBatch, encode_frame
from edge_client.models import build_model
from edge_client.mqtt import validate_device_id
from edge_client.protocol import (
    ARRAYS,
    CONFIG,
    DEVICE,
    FRAME,
    METRICS,
    UPDATE,
    metrics_record,
    plan_from_config,
)
from edge_client.replay import parse_profile, replay_into
from edge_client.schedule import device_rng
from edge_client.sources import pick_classes
from edge_client.trainer import LocalPlan, pick_device, train_local

__all__ = ["app", "train"]

log = logging.getLogger(__name__)

# Device-state keys in the buffer file (the ClientApp process does not outlive a round).
FEEDBACK_RUN = "codec-run"
FEEDBACK_RESIDUAL = "codec-residual"
FEEDBACK_GAP = "codec-gap"
INJECT_SEQ = "inject-seq"

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train this round's plan on the device's buffer and reply with the new weights."""
    node = context.node_config
    device_id, buffer_path, slowdown = _device(context)
    threads = int(node.get("threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    plan = plan_from_config(msg.content.config_records[CONFIG])
    with BufferStore(buffer_path) as store:
        model = build_model(
            str(context.run_config.get("model", "cnn")),
            store.shape,
            int(context.run_config.get("num-classes", DEFAULT_NUM_CLASSES)),
        )
        received = msg.content.array_records[ARRAYS].to_torch_state_dict()
        model.load_state_dict({k: v.float() for k, v in received.items()})  # fp16 broadcast too
        start = _numpy_state(model)
        opted_in = _flag(node.get("inject", False))
        rng = device_rng(int(context.run_id) % 2**32, device_id, _round_of(msg))
        pool_path = inject_pool_path(buffer_path)
        with contextlib.ExitStack() as stack:
            pool = (
                stack.enter_context(BufferStore(pool_path))
                if opted_in and plan.inject_mix > 0 and pool_path.exists()
                else None
            )
            result = train_local(
                model, store, plan, slowdown=slowdown, device=pick_device(), pool=pool, rng=rng
            )
        delta = {k: v - start[k] for k, v in _numpy_state(model).items()}
        frame, gap = _encode(store, context.run_id, delta, plan, result.num_examples > 0)
        injection = {"inject-opt-in": int(opted_in), "inject-bytes": 0, "inject-samples": 0}
        if opted_in and plan.inject_publish and result.taken is not None:
            injection.update(_share(store, device_id, result.taken, plan, rng))
        buffer = store.stats()
    content = RecordDict(
        {
            UPDATE: ConfigRecord({FRAME: frame}),
            METRICS: metrics_record(result, buffer, len(frame), gap, injection),
            DEVICE: ConfigRecord({"device-id": device_id}),
        }
    )
    return Message(content, reply_to=msg)


def _share(
    store: BufferStore,
    device_id: str,
    taken: SampleBatch,
    plan: LocalPlan,
    rng: np.random.Generator,
) -> dict[str, int]:
    """Queue a fraction beta of the samples just trained on for injection, within the budget.

    One binary frame (publisher = this device, a sequence number kept in the buffer file) goes
    to the buffer's outbox; the ingest daemon publishes it to ``fedstream/v1/inject``.
    """
    per_sample = 4 * int(np.prod(taken.x.shape[1:])) + 16  # features + label + timestamp
    header = len(encode_frame(taken.x[:0], taken.y[:0], taken.ts[:0], publisher=device_id))
    fits = max(0, (min(plan.inject_budget, INJECT_MAX_PAYLOAD_BYTES) - header) // per_sample)
    n = min(int(plan.inject_beta * len(taken)), fits)
    if n <= 0:
        return {}
    idx = np.sort(rng.choice(len(taken), size=n, replace=False))
    seq = int(store.get_state(INJECT_SEQ) or b"0") + 1
    payload = encode_frame(taken.x[idx], taken.y[idx], taken.ts[idx], publisher=device_id, seq=seq)
    store.queue_outbox([payload])
    store.set_state({INJECT_SEQ: str(seq).encode()})
    return {"inject-bytes": len(payload), "inject-samples": n}


def _flag(value: object) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def _round_of(msg: Message) -> int:
    """The message's server round (0 when absent)."""
    return int(msg.content.config_records[CONFIG].get("server-round", 0))  # type: ignore[arg-type]


def _numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _encode(
    store: BufferStore, run_id: int, delta: dict[str, np.ndarray], plan: LocalPlan, trained: bool
) -> tuple[bytes, float | None]:
    """Code the delta with the device's error-feedback state, kept in its buffer file.

    A round that trained nothing sends a zero delta and leaves the state alone (the server
    gives it no weight, so a residual spent on it would be lost).
    """
    state = _load_feedback(store, run_id, delta)
    if not trained:
        return encode(delta, "none"), state.gap
    packed = compress(delta, state, plan.compress, plan.compress_ratio)
    residual = packed.state.residual or {}
    store.set_state(
        {
            FEEDBACK_RUN: str(run_id).encode(),
            FEEDBACK_RESIDUAL: encode(residual, "none"),
            FEEDBACK_GAP: repr(packed.state.gap).encode(),
        }
    )
    return packed.frame, packed.state.gap


def _load_feedback(store: BufferStore, run_id: int, like: dict[str, np.ndarray]) -> FeedbackState:
    """The residual and gap EWMA this device kept for this run (fresh for a new run)."""
    if store.get_state(FEEDBACK_RUN) != str(run_id).encode():
        return FeedbackState()
    try:
        residual = decode(
            store.get_state(FEEDBACK_RESIDUAL) or b"", {k: v.shape for k, v in like.items()}
        )
        gap = float(store.get_state(FEEDBACK_GAP) or b"nan")
    except (CodecError, ValueError) as err:
        log.warning("dropping an unreadable error-feedback residual: %s", err)
        return FeedbackState()
    return FeedbackState(residual, gap if math.isfinite(gap) else None)


def _device(context: Context) -> tuple[str, str, float]:
    """(device id, buffer path, slowdown) of this node, real or simulated."""
    node = context.node_config
    if "device-id" in node and "buffer" in node:
        device_id = validate_device_id(str(node["device-id"]))
        slowdown = float(node.get("slowdown", 1.0))
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        return device_id, str(node["buffer"]), slowdown
    if "partition-id" not in node:
        raise ValueError("node config needs device-id and buffer (flower-supernode --node-config)")
    run = context.run_config
    pid = int(node["partition-id"])
    device_id = f"sim-{pid}"
    rates = parse_profile(str(run.get("sim-rates", "200")), "sim-rates", 1e-9)
    slowdowns = parse_profile(str(run.get("sim-slowdowns", "1")), "sim-slowdowns", 1.0)
    root = Path(str(run.get("sim-dir", "")) or Path(tempfile.gettempdir()) / "fedstream-sim")
    path = root / f"run-{context.run_id}" / f"{device_id}.sqlite"
    k = int(run.get("sim-labels", 0))
    replay_into(
        path,
        device_id,
        rates[pid % len(rates)],
        initial=int(run.get("sim-initial", 2000)),
        capacity=DEFAULT_CAPACITY,
        seed=int(run.get("seed", 0)),
        labels=pick_classes(k, DEFAULT_NUM_CLASSES, index=pid) if k else None,
        dirichlet=float(run.get("sim-dirichlet", 0.0)) or None,
        feature_shift=float(run.get("sim-feature-shift", 0.0)),
    )
    return device_id, str(path), slowdowns[pid % len(slowdowns)]
