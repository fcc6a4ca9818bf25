"""Builders the tests share: mock replies for strategy tests (as Flower's own strategy tests
build them), heterogeneity estimates of a given fit, round records, the types of the shared
fixtures, commands run so that nothing they start outlives the test, and ``fedstream demo``
as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message

from aggregator.heterogeneity import Heterogeneity
from aggregator.round_log import RoundRecord
from deploy.inprocess import VirtualDevice
from deploy.local import fedstream_command, stop_tree
from edge_client.wire.codec import encode
from edge_client.wire.records import DeviceReply, ReplyMetrics
from edge_client.wire.run_config import RunSettings

#: The ``fast`` fixture (tests/conftest.py): a short in-process run's settings, with overrides.
Fast = Callable[..., RunSettings]
#: The ``fleet`` fixture: virtual devices ``dev-0``, ``dev-1``, ... one per slowdown given.
Fleet = Callable[..., list[VirtualDevice]]


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


def fitted(h: float, s: float) -> Heterogeneity:
    """A heterogeneity estimate whose pooled fit is exactly ``H = h``, ``S = s`` (two pairs on
    the line ``D = 2 h + s x``, at ``x`` = 0.01 and 0.02), so that its ratio is ``s / h``."""
    xs = np.array([0.01, 0.02])
    ys = 2 * h + s * xs
    het = Heterogeneity()
    het.load_state_dict(
        {
            "sums": [2.0, xs.sum(), (xs**2).sum(), ys.sum(), (xs * ys).sum()],
            "scale": 1.0,
            "rounds": 1,
        }
    )
    return het


def round_record(**fields: Any) -> RoundRecord:
    """A round 1 in which nothing was planned, sent or timed (accuracy 0.5, loss 1.0, B = 8,
    no devices, no bytes, no time), with ``fields`` set."""
    values: dict[str, Any] = {
        "round": 1, "accuracy": 0.5, "loss": 1.0, "global_batch": 8, "sum_b": 8, "lr_scale": 1.0,
        "planned": {}, "devices": {}, "failed": {}, "rejected": {}, "rejected_reasons": {},
        "compress": "none", "aggregation": "fedavg", "aggregated": [], "bytes_up": 0,
        "broadcast_bytes": 0, "inject_picked": [], "inject_bytes": 0, "virtual_s": 0.0,
        "wall_s": 0.0,
    }  # fmt: skip
    return RoundRecord(**{**values, **fields})


#: Seconds a stopped command gets to stop what it started before all of it is killed: the
#: demo's own bound (10 s) and some.
STOP_GRACE_S = 15.0


def run_command(
    cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``, except that a
    timeout, or the test failing meanwhile (pytest-timeout's signal), stops the command as a
    user would: SIGTERM, time to stop its children, then SIGKILL to it and everything it
    started. (``subprocess.run`` would SIGKILL the command alone, and leave its children
    running for the rest of the suite.)"""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=None if env is None else {**os.environ, **env},
        start_new_session=True,  # its own group: the signals reach it alone
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_command(proc)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def stop_command(proc: subprocess.Popen[Any]) -> None:
    """Stop a command started in its own session and everything it started: SIGTERM,
    :data:`STOP_GRACE_S` seconds, then SIGKILL to whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid, 0.0, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


#: pytest's bound on a test that runs a whole demo: above :func:`demo`'s own (400 s), so that
#: on a slow machine the demo is stopped as a user would stop it, not the test cut first.
DEMO_TEST_TIMEOUT_S = 420


def demo(tmp_path: Path, *args: str, timeout: float = 400) -> tuple[int, str, dict[str, Any]]:
    """Run ``fedstream demo --no-live --out TMP ARGS`` as a user would: (exit code, output with
    whitespace collapsed, summary.json or {})."""
    proc = run_command(
        fedstream_command("demo", "--no-live", "--out", str(tmp_path), *args), timeout=timeout
    )
    summaries = list(tmp_path.glob("run-*/summary.json"))
    summary = json.loads(summaries[0].read_text()) if summaries else {}
    # rich wraps long lines at the terminal width: compare text with whitespace collapsed
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), summary
