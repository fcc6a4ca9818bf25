"""The worked examples of ``docs/sensors.md`` ("Worked examples"), run as written: every
``bash`` block of that section, in order, in one folder, with ``BROKER`` pointing at a stock
Mosquitto (about 30 seconds)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.brokers import MosquittoBroker

pytestmark = [
    pytest.mark.mosquitto,
    pytest.mark.skipif(
        shutil.which("mosquitto_pub") is None,
        reason="mosquitto_pub not installed (apt-get install -y mosquitto-clients)",
    ),
]

DOC = Path(__file__).resolve().parents[2] / "docs" / "sensors.md"
SECTION = "## Worked examples"
BLOCK_TIMEOUT_S = 90


def worked_examples() -> list[str]:
    """The section's bash blocks, in order."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else len(text)]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


@pytest.fixture
def stock() -> Iterator[MosquittoBroker]:
    with MosquittoBroker.stock() as broker:
        yield broker


def run_block(block: str, cwd: Path, broker: str) -> str:
    """Run one block with bash in its own process group (what it leaves running is killed
    with it); return its output, failing the test with it if the block fails."""
    env = {
        **os.environ,
        "BROKER": broker,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    proc = subprocess.Popen(
        ["bash", "-e", "-c", block],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    finally:
        # the block's background daemon, if the block stopped before its kill
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == 0, f"block failed ({proc.returncode}):\n{block}\n---\n{out}"
    return out


def last_json(out: str) -> dict[str, object]:
    """The last line of a block's output that is a JSON object (``fedstream status --json``)."""
    line = next(line for line in reversed(out.splitlines()) if line.startswith("{"))
    status = json.loads(line)
    assert isinstance(status, dict)
    return status


@pytest.mark.timeout(400)
def test_the_worked_examples_run_as_written(stock: MosquittoBroker, tmp_path: Path) -> None:
    # Prepare
    blocks = worked_examples()
    assert len(blocks) == 6, "a recording, four conventions and the discovery"
    # Execute / Assert: each block as written; a convention's daemon took the replay whole
    # (200 readings: 600 bare values for ESPHome, one value a reading otherwise) and made
    # windows of it, nothing refused; the discovery lists both sensors and reads them
    recording, *conventions, discovery = blocks
    run_block(recording, tmp_path, stock.url)
    assert len((tmp_path / "kitchen.csv").read_text().splitlines()) == 601
    for block in conventions:
        status = last_json(run_block(block, tmp_path, stock.url))
        assert status["rejected"] == 0, status
        readings = status["readings"]
        assert readings in (200, 600), status
        assert isinstance(status["accepted"], int) and status["accepted"] >= 5, status
    out = run_block(discovery, tmp_path, stock.url)
    command = next(line for line in out.splitlines() if line.startswith("fedstream ingest"))
    for name in ("temperature", "humidity"):
        assert f"esphome/kitchen/sensor/{name}/state={name}" in command, out
    assert "--payload plain" in command and "--buffer ha.sqlite" in command
