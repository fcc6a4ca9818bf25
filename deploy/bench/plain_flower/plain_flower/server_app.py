"""The baseline's ServerApp: Flower's FedAvg through ``Strategy.start``, unmodified.

Federated evaluation is off and the model is scored centrally after every round, as
fedstream's ``eval-data`` does; the central evaluation's calls time the rounds (each
round's wall time is from one call to the next), written to ``timing-file``.

``pull-interval`` (seconds, 0 by default) is the one change the benchmark can ask for: the
grid's ``send_and_receive``, which Flower's deployment grid runs as a pull every 3 s, then
pushes and pulls every ``pull-interval`` seconds instead, as fedstream's ServerApp does, so
that the two are compared like for like. Nothing else differs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from plain_flower.task import Net, accuracy, local_data

app = ServerApp()


def pull_every(grid: Grid, interval: float) -> None:
    """Make ``grid.send_and_receive`` push, then pull every ``interval`` seconds until every
    reply is in or its timeout passes (Flower's own loop, with another sleep)."""

    def send_and_receive(
        messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        pending = set(grid.push_messages(messages))
        end = time.time() + (timeout or 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            got = list(grid.pull_messages(pending))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            if not pending:
                break
            time.sleep(interval)
        return replies

    grid.send_and_receive = send_and_receive  # type: ignore[method-assign]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg over every node, for ``num-server-rounds`` rounds."""
    cfg = context.run_config
    if float(cfg.get("pull-interval", 0.0)) > 0:
        pull_every(grid, float(cfg["pull-interval"]))
    torch.set_num_threads(1)
    shape = tuple(int(v) for v in str(cfg["sample-shape"]).split(","))
    classes, nodes = int(cfg["num-classes"]), int(cfg["min-nodes"])
    torch.manual_seed(0)
    model = Net(shape[0], classes, int(cfg["model-width"]))
    test_x, test_y = local_data(10**6, int(cfg["eval-samples"]), shape, classes)
    stamps: list[float] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        stamps.append(time.monotonic())
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(model, test_x, test_y)})

    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=nodes,
        min_available_nodes=nodes,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(cfg["num-server-rounds"]),
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        evaluate_fn=evaluate,
    )
    if cfg["timing-file"]:
        rounds = [
            {
                "round": r,
                "wall-s": stamps[r] - stamps[r - 1],
                **dict(result.train_metrics_clientapp.get(r, {})),
            }
            for r in range(1, len(stamps))
        ]
        Path(str(cfg["timing-file"])).write_text(json.dumps({"rounds": rounds}, indent=1))
