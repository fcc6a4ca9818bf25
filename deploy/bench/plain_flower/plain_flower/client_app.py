"""The baseline's ClientApp: one round of local training on the node's local array.

It reports, besides ``num-examples``, where its process's time went (read from Linux's
``/proc`` and :mod:`resource`), as fedstream's replies do, so that the two can be compared.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from plain_flower.task import Net, local_data, train

app = ClientApp()


def _process_age_s() -> float:
    try:
        stat = Path(f"/proc/{os.getpid()}/stat").read_text()
        started = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))


@app.train()
def train_round(msg: Message, context: Context) -> Message:
    """Train ``local-steps`` steps of ``batch-size`` on the node's samples."""
    entered, start_s = time.perf_counter(), _process_age_s()
    cfg = context.run_config
    torch.set_num_threads(1)
    shape = tuple(int(v) for v in str(cfg["sample-shape"]).split(","))
    classes, steps, batch = int(cfg["num-classes"]), int(cfg["local-steps"]), int(cfg["batch-size"])
    model = Net(shape[0], classes, int(cfg["model-width"]))
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    seed = int(context.node_config.get("seed", 0)) * 1000 + int(msg.metadata.group_id or 0)
    x, y = local_data(seed, steps * batch, shape, classes)
    trained = time.perf_counter()
    loss = train(model, x, y, steps, batch, float(cfg["lr"]), str(cfg["optimizer"]))
    done = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    metrics = MetricRecord(
        {
            "num-examples": steps * batch,
            "train-loss": loss,
            "start-s": start_s,
            "train-s": done - trained,
            "handler-s": done - entered,
            "cpu-s": usage.ru_utime + usage.ru_stime,
            "peak-rss": usage.ru_maxrss * 1024,
        }
    )
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)
