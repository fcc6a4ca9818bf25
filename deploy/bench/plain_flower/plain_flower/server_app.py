"""The baseline's ServerApp: Flower's FedAvg through ``Strategy.start``, unmodified.

Federated evaluation is off and the model is scored centrally after every round, as
fedstream's ``eval-data`` does; the central evaluation's calls time the rounds (each
round's wall time is from one call to the next), written to ``timing-file``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from plain_flower.task import Net, accuracy, local_data

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg over every node, for ``num-server-rounds`` rounds."""
    cfg = context.run_config
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
