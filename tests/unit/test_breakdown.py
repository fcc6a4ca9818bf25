"""Where a round's wall time goes: the aggregator's timing, the devices' reply figures, the
breakdown along the slowest device, and what a process costs its device."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from aggregator.round_log import RoundRecord, RoundTiming, rounds_only
from aggregator.server_app import run_rounds
from deploy.breakdown import PARTS, round_breakdown, run_breakdown
from deploy.inprocess import InProcessGrid
from edge_client.runtime.trainer import LocalSGD
from edge_client.runtime.usage import (
    children,
    cpu_s,
    disk_write_bytes,
    parent,
    peak_rss_bytes,
    process_age_s,
)
from edge_client.task.models import build_model
from edge_client.wire.records import ReplyMetrics
from tests.helpers import Fast, Fleet, round_record


def test_the_aggregators_parts_and_the_devices_parts_add_up(
    tmp_path: Path, fast: Fast, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the real ServerApp loop and ClientApp, in process, with a checkpoint. The
    # virtual clock charges no scoring, so a virtual device reports none: the scoring's wall
    # seconds each reply measured (a few ms here, seconds on a starved machine) are noted
    # before the charge drops them, by the reply's handler seconds.
    grid = InProcessGrid(fleet(1, 2, rate=20_000), tmp_path / "buffers")
    settings = fast(num_rounds=3, local_steps=10, checkpoint_dir=str(tmp_path / "ckpt"))
    scoring_s: dict[float, float] = {}
    charge = InProcessGrid._charge

    def noting(self: InProcessGrid, reply: Any, dev: Any, wait_s: float) -> ReplyMetrics:
        scoring_s[reply.metrics.handler_s] = reply.metrics.eval_s
        return charge(self, reply, dev, wait_s)

    monkeypatch.setattr(InProcessGrid, "_charge", noting)
    # Execute
    records = rounds_only(run_rounds(grid, settings))
    # Assert: the aggregator's parts are its round's wall time (rounded to 1 ms each)
    for r in records:
        assert r.timing.checkpoint_s > 0 and r.timing.replies_s > 0
        assert r.timing.total == pytest.approx(r.wall_s, abs=0.01)
        assert set(r.latency) == set(r.devices)
        assert max(r.latency.values()) <= r.timing.replies_s + 1e-3
        for m in r.devices.values():  # the handler's parts: within 5 % or 20 ms
            assert m.eval_s == 0.0 and m.eval_count > 0 and scoring_s[m.handler_s] > 0
            parts = m.setup_s + m.wait_s + m.take_s + scoring_s[m.handler_s] + m.train_s
            parts += m.encode_s
            assert parts <= m.handler_s
            assert m.handler_s - parts <= max(0.02, 0.05 * m.handler_s)
            assert m.train_s > 0 and m.cpu_s > 0 and m.peak_rss > 0


def _record(latency: dict[str, float], wall: float, **metrics: Any) -> RoundRecord:
    base = ReplyMetrics(num_examples=10, batch_size=1, step_s=0.1, train_loss=0.5)
    m = replace(base, **metrics)
    timing = RoundTiming(plan_s=0.1, replies_s=max(latency.values()), aggregate_s=0.2, eval_s=0.3)
    return round_record(
        devices={d: m for d in latency},
        aggregated=list(latency),
        wall_s=wall,
        timing=replace(timing, checkpoint_s=0.05),
        latency=latency,
    )


def test_a_round_is_read_along_its_slowest_device() -> None:
    # Prepare: hand-computed; the slowest reply (dev-b, 9 s) ends the round
    handler = dict(setup_s=0.1, wait_s=0.5, take_s=0.1, eval_s=0.2, train_s=2.0, encode_s=0.1)
    record = _record({"dev-a": 5.0, "dev-b": 9.0}, wall=9.65, start_s=3.0, **handler, handler_s=3.1)
    # Execute
    parts = round_breakdown(record)
    # Assert
    assert parts is not None and list(parts) == list(PARTS)
    assert parts["aggregator"] == pytest.approx(0.1 + 0.2 + 0.3 + 0.05)
    assert parts["flower"] == pytest.approx(9.0 - 3.0 - 3.1)
    assert parts["handler-other"] == pytest.approx(3.1 - 3.0)
    assert parts["other"] == pytest.approx(0.0, abs=1e-9)
    assert sum(parts.values()) == pytest.approx(9.65)
    summary = run_breakdown([record, record])
    assert summary["rounds"] == 2 and summary["training_share"] == pytest.approx(2.2 / 9.65, 1e-3)
    assert sum(summary["shares"].values()) == pytest.approx(1.0, abs=1e-3)


def test_rounds_without_device_timing_have_no_breakdown() -> None:
    # Prepare: a reply of an older fedstream (no handler time), and an async aggregation
    old = _record({"dev-a": 5.0}, wall=6.0)
    asynchronous = replace(old, mode="async")
    # Execute / Assert
    assert round_breakdown(old) is None and round_breakdown(asynchronous) is None
    assert run_breakdown([old]) == {}


def test_local_sgd_updates_the_weights_as_torch_optim_sgd_does() -> None:
    # Prepare: two copies of one model, one batch
    torch.manual_seed(0)
    x, y = torch.randn(16, 6, 32), torch.randint(0, 6, (16,))
    ours, theirs = build_model("cnn", (6, 32), 6), build_model("cnn", (6, 32), 6)
    mine = LocalSGD(ours.parameters(), lr=0.05, momentum=0.9)
    reference = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    # Execute: five steps each
    for model, opt in ((ours, mine), (theirs, reference)):
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
    # Assert: bit for bit
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_local_training_does_not_import_torch_dynamo() -> None:
    # Prepare: a fresh interpreter, as a ClientApp process is
    code = (
        "import sys, torch\n"
        "from edge_client.runtime.trainer import LocalSGD\n"
        "from edge_client.task.models import build_model\n"
        "m = build_model('cnn', (6, 32), 6)\n"
        "opt = LocalSGD(m.parameters(), lr=0.1, momentum=0.9)\n"
        "torch.nn.functional.cross_entropy(m(torch.randn(4, 6, 32)), torch.zeros(4).long())"
        ".backward()\n"
        "opt.step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    # Execute
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # Assert: the 1.3-1.5 s import is not paid per message
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="Linux /proc only")
def test_a_process_reports_its_age_cpu_memory_and_writes(tmp_path: Path) -> None:
    # Prepare: a child that sleeps, and a file written through to storage
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        before = disk_write_bytes()
        with (tmp_path / "f").open("wb") as fh:
            fh.write(b"x" * 200_000)
            fh.flush()
            os.fsync(fh.fileno())
        burnt = time.process_time()
        while time.process_time() - burnt < 0.05:
            pass
        # Execute
        age, used = process_age_s(), cpu_s()
        kids = children(os.getpid())
        # Assert
        assert age > 0 and used >= 0.05
        assert peak_rss_bytes() > 10 << 20 and peak_rss_bytes(child.pid) > 0
        assert disk_write_bytes() - before >= 200_000
        assert child.pid in kids and parent(child.pid) == os.getpid()
        assert 0 <= process_age_s(child.pid) < age and cpu_s(child.pid) >= 0
    finally:
        child.kill()
        child.wait()
