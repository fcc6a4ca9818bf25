"""Builders the tests share: mock replies for strategy tests (as Flower's own strategy tests
build them), and ``fedstream demo`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message

from deploy.local import fedstream_command
from edge_client.wire.codec import encode
from edge_client.wire.records import DeviceReply, ReplyMetrics


def mock_reply(
    ask: Message,
    device: str,
    delta: Mapping[str, Any] | None = None,
    num_examples: int = 10,
    *,
    frame: bytes | None = None,
    **metrics: Any,
) -> Message:
    """A device's reply to ``ask``: ``delta`` coded as a dense frame (or ``frame`` as it is),
    with ``num_examples`` samples at one step and the other ``metrics`` given."""
    if frame is None:
        frame = encode({k: np.asarray(v, np.float32) for k, v in (delta or {}).items()})
    values = {
        "num_examples": num_examples,
        "batch_size": num_examples,
        "local_steps": 1,
        "step_s": 0.01,
        "compute_s": 0.01,
        "train_loss": 1.0,
        **metrics,
    }
    reply = DeviceReply(device, ReplyMetrics(**values), frame)
    return Message(reply.to_content(), reply_to=ask)


def demo(tmp_path: Path, *args: str, timeout: float = 400) -> tuple[int, str, dict[str, Any]]:
    """Run ``fedstream demo --no-live --out TMP ARGS`` as a user would: (exit code, output with
    whitespace collapsed, summary.json or {})."""
    proc = subprocess.run(
        fedstream_command("demo", "--no-live", "--out", str(tmp_path), *args),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    summaries = list(tmp_path.glob("run-*/summary.json"))
    summary = json.loads(summaries[0].read_text()) if summaries else {}
    # rich wraps long lines at the terminal width: compare text with whitespace collapsed
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), summary
