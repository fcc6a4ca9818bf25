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

import math
import tempfile
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from edge_client.buffer import BufferStore
from edge_client.constants import DEFAULT_CAPACITY, DEFAULT_NUM_CLASSES
from edge_client.models import build_model
from edge_client.mqtt import validate_device_id
from edge_client.protocol import ARRAYS, CONFIG, DEVICE, METRICS, metrics_record, plan_from_config
from edge_client.replay import parse_profile, replay_into
from edge_client.trainer import pick_device, train_local

__all__ = ["app", "train"]

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
    replay_into(
        path,
        device_id,
        rates[pid % len(rates)],
        initial=int(run.get("sim-initial", 2000)),
        capacity=DEFAULT_CAPACITY,
        seed=int(run.get("seed", 0)),
    )
    return device_id, str(path), slowdowns[pid % len(slowdowns)]
