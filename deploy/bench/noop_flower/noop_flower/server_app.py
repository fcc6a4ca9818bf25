"""The do-nothing ServerApp: ``num-server-rounds`` rounds of one empty message to every
node, each round's wall time and its replies' mean metrics written to ``timing-file``."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()

KEYS = ("start-s", "train-s", "cpu-s", "peak-rss")


def _number(value: object) -> float:
    """A metric's value as a float (each of these is one number)."""
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Send and receive one round after the other, every node each time."""
    cfg = context.run_config
    nodes: list[int] = []
    while len(nodes) < int(cfg["min-nodes"]):
        nodes = list(grid.get_node_ids())
        time.sleep(0.5)
    rounds = []
    last = time.monotonic()
    for r in range(1, int(cfg["num-server-rounds"]) + 1):
        content = RecordDict({"config": ConfigRecord({"server-round": r})})
        messages = [Message(content, dst_node_id=n, message_type="train") for n in nodes]
        replies = [m for m in grid.send_and_receive(messages) if m.has_content()]
        now = time.monotonic()
        metrics = [m.content.metric_records["metrics"] for m in replies]
        means = {k: statistics.mean(_number(m[k]) for m in metrics) for k in KEYS if metrics}
        rounds.append({"round": r, "wall-s": now - last, "replies": len(replies), **means})
        last = now
    if cfg["timing-file"]:
        Path(str(cfg["timing-file"])).write_text(json.dumps({"rounds": rounds}, indent=1))
