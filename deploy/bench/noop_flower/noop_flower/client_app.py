"""The do-nothing ClientApp: it imports Flower only and replies with what its process cost."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

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
def reply(msg: Message, context: Context) -> Message:
    """Reply at once, with the process's age, CPU seconds and peak memory."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    metrics = MetricRecord(
        {
            "num-examples": 1,
            "start-s": _process_age_s(),
            "train-s": 0.0,
            "cpu-s": usage.ru_utime + usage.ru_stime,
            "peak-rss": usage.ru_maxrss * 1024,
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
