"""The fedstream ClientApp: one Flower message = one round of training from the buffer.

Flower 1.42 starts a fresh process per message, so everything that must outlive a round
lives in the buffer store (fed by ``fedstream ingest``) or comes in the message.

Node config (``flower-supernode --node-config``): ``device-id`` (required), ``buffer``
(path of the device's buffer file, required), ``slowdown`` (>= 1, emulates a slower device),
``threads`` (torch intra-op threads; 0 leaves torch's default).
"""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from edge_client.buffer import BufferStore
from edge_client.constants import DEFAULT_NUM_CLASSES
from edge_client.models import build_model
from edge_client.mqtt import validate_device_id
from edge_client.protocol import ARRAYS, CONFIG, DEVICE, METRICS, metrics_record, plan_from_config
from edge_client.trainer import pick_device, train_local

__all__ = ["app", "train"]

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train this round's plan on the device's buffer and reply with the new weights."""
    node = context.node_config
    if "device-id" not in node or "buffer" not in node:
        raise ValueError("node config needs device-id and buffer (flower-supernode --node-config)")
    device_id = validate_device_id(str(node["device-id"]))
    slowdown = float(node.get("slowdown", 1.0))
    if not (math.isfinite(slowdown) and slowdown >= 1.0):
        raise ValueError(f"slowdown must be >= 1, got {slowdown}")
    threads = int(node.get("threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    plan = plan_from_config(msg.content.config_records[CONFIG])
    with BufferStore(str(node["buffer"])) as store:
        model = build_model(
            str(context.run_config.get("model", "cnn")),
            store.shape,
            int(context.run_config.get("num-classes", DEFAULT_NUM_CLASSES)),
        )
        model.load_state_dict(msg.content.array_records[ARRAYS].to_torch_state_dict())
        result = train_local(model, store, plan, slowdown=slowdown, device=pick_device())
        buffer = store.stats()
    arrays = ArrayRecord(model.cpu().state_dict())
    bytes_up = sum(a.numpy().nbytes for a in arrays.values())
    content = RecordDict(
        {
            ARRAYS: arrays,
            METRICS: metrics_record(result, buffer, bytes_up),
            DEVICE: ConfigRecord({"device-id": device_id}),
        }
    )
    return Message(content, reply_to=msg)
