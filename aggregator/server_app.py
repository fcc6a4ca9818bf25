"""The fedstream ServerApp: rounds of planned training, evaluation, metrics, checkpoints.

It drives the rounds itself (rather than ``Strategy.start``) so that it can checkpoint
after every round, resume from the last checkpoint, and write per-device metrics.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.serverapp import Grid, ServerApp

from aggregator.checkpoint import RUN_CONFIG, Checkpoint, load_checkpoint, save_checkpoint
from aggregator.controller import BatchController
from aggregator.settings import RunSettings
from aggregator.strategy import StreamStrategy
from edge_client.datasets import load_dataset
from edge_client.models import build_model
from edge_client.trainer import evaluate

__all__ = ["app", "run_rounds"]

log = logging.getLogger(__name__)
PULL_INTERVAL_S = 0.2

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: settings from the run config, then :func:`run_rounds`."""
    run_rounds(grid, RunSettings.from_run_config(context.run_config))


def run_rounds(grid: Grid, settings: RunSettings) -> list[dict[str, Any]]:
    """Run (or resume) the federated training; return the per-round metrics records.

    Parameters
    ----------
    grid : Grid
        Flower's grid (deployment, simulation, or the in-process runner).
    settings : RunSettings
        The run's tunables.
    """
    data = load_dataset(settings.dataset, settings.num_classes)
    x_eval, y_eval = data.eval_set(settings.eval_samples, settings.seed)
    model = build_model(settings.model, data.shape, settings.num_classes, seed=settings.seed)
    arrays = ArrayRecord(model.state_dict())
    controller = BatchController(settings.controller_config())
    strategy = StreamStrategy(settings=settings, controller=controller)
    start = 1
    ckpt = (
        load_checkpoint(settings.checkpoint_dir)
        if settings.checkpoint_dir and settings.resume
        else None
    )
    if ckpt is not None:
        _check_resumable(ckpt, settings)
        arrays = ckpt.arrays
        strategy.controller = BatchController.from_state_dict(ckpt.controller)
        strategy.last_metrics = ckpt.extra.get("last-metrics", {})
        strategy.node_devices = {int(n): d for n, d in ckpt.extra.get("node-devices", {}).items()}
        strategy.retired = {int(n) for n in ckpt.extra.get("retired-nodes", [])}
        start = ckpt.server_round + 1
        log.info("resuming after round %d from %s", ckpt.server_round, settings.checkpoint_dir)
        if start > settings.num_rounds:
            log.info("the checkpoint already holds all %d rounds: nothing to do", start - 1)
    out = Path(settings.out_dir) if settings.out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    t_run = time.monotonic()
    for server_round in range(start, settings.num_rounds + 1):
        wait_for_nodes(grid, settings.min_nodes, settings.round_timeout)
        t0 = time.monotonic()
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        replies = exchange(grid, messages, strategy, settings.round_timeout)
        new_arrays, _ = strategy.aggregate_train(server_round, replies)
        if new_arrays is not None:
            arrays = new_arrays
        model.load_state_dict(arrays.to_torch_state_dict())
        accuracy, loss = evaluate(model, x_eval, y_eval)
        wall = time.monotonic() - t0
        record = _round_record(server_round, strategy, settings, accuracy, loss, wall)
        record["run-wall-s"] = round(time.monotonic() - t_run, 3)
        strategy.round_s = record["virtual-s"] or wall
        records.append(record)
        log.info(
            "round %d: accuracy %.3f, %d of %d devices, sum b %d",
            server_round,
            accuracy,
            len(strategy.reports),
            len(messages),
            record["sum-b"],
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
                    {**strategy.state_dict(), RUN_CONFIG: settings.to_run_config()},
                ),
            )
        if out is not None:
            with (out / "metrics.jsonl").open("a") as fh:
                fh.write(json.dumps(record) + "\n")
    return records


#: Settings a checkpoint's model depends on: a resume must not change them.
MODEL_KEYS = ("model", "num-classes", "dataset")


def _check_resumable(ckpt: Checkpoint, settings: RunSettings) -> None:
    """Refuse a checkpoint made for another model (its arrays would not fit).

    Raises
    ------
    ValueError
        If the checkpoint's run config names another model, class count or dataset.
    """
    saved = ckpt.extra.get(RUN_CONFIG, {})
    now = settings.to_run_config()
    changed = [
        f"{k}: {saved[k]!r} -> {now[k]!r}" for k in MODEL_KEYS if k in saved and saved[k] != now[k]
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


def exchange(
    grid: Grid, messages: list[Message], strategy: StreamStrategy, timeout: float
) -> list[Message]:
    """Push the round's messages and pull replies until all are in or ``timeout`` passes.

    Unlike ``Grid.send_and_receive`` this keeps the message ids (an error reply names
    the SuperLink as its source, so the ids are how a failed device is found) and polls
    every 0.2 s instead of every 3 s.
    """
    ids = list(grid.push_messages(messages))
    strategy.sent = {i: m.metadata.dst_node_id for i, m in zip(ids, messages, strict=True)}
    replies: list[Message] = []
    pending = set(ids)
    deadline = time.monotonic() + timeout
    while pending:
        for reply in grid.pull_messages(list(pending)):
            pending.discard(reply.metadata.reply_to_message_id)
            replies.append(reply)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(PULL_INTERVAL_S)
    return replies


def _round_record(
    server_round: int,
    strategy: StreamStrategy,
    settings: RunSettings,
    accuracy: float,
    loss: float,
    wall: float,
) -> dict[str, Any]:
    devices: dict[str, dict[str, Any]] = {}
    virtual = 0.0
    for r in strategy.reports:
        m = r.metrics
        transfer = m.get("bytes-up", 0.0) * 8 / (settings.uplink_mbps * 1e6)
        virtual = max(virtual, m["compute-s"] + m["wait-s"] + transfer)
        devices[r.device_id] = {
            "planned-batch": r.planned_batch,
            "batch": int(m["batch-size"]),
            "steps": int(m["local-steps"]),
            "num-examples": int(m["num-examples"]),
            "compute-s": m["compute-s"],
            "step-s": m["step-s"],
            "wait-s": m["wait-s"],
            "rate": m.get("stream-rate", 0.0),
            "fill": int(m.get("buffer-fill", 0)),
            "dropped": int(m.get("buffer-dropped", 0)),
            "bytes": int(m.get("bytes-up", 0)),
            "loss": m["train-loss"],
            "gap": m.get("compress-gap"),
            "inject-used": int(m.get("inject-used", 0)),
            "inject-bytes": int(m.get("inject-bytes", 0)),
            "inject-samples": int(m.get("inject-samples", 0)),
        }
    return {
        "round": server_round,
        "accuracy": accuracy,
        "loss": loss,
        "global-batch": settings.global_batch,
        "sum-b": strategy.plan.total,
        "lr-scale": strategy.plan.lr_scale,
        # Keyed by device id (round 1 plans for nodes not yet known by their device id).
        "planned": {
            **{d: b for d, b in strategy.plan.batches.items() if not d.startswith("node-")},
            **{r.device_id: r.planned_batch for r in strategy.reports},
        },
        "devices": devices,
        "failed": dict(strategy.failed),
        "rejected": dict(strategy.rejected),
        "rejected-reasons": dict(strategy.rejected_reasons),
        "compress": strategy.mode,
        "aggregation": settings.aggregation,
        "aggregated": sorted(strategy.aggregated),
        "bytes-up": sum(d["bytes"] for d in devices.values()),
        "broadcast-bytes": strategy.broadcast_bytes,
        "inject-picked": strategy.injectors,
        "inject-bytes": sum(d["inject-bytes"] for d in devices.values()),
        "virtual-s": round(virtual, 6),
        "wall-s": round(wall, 3),
    }
