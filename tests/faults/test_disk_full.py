"""The disk under the buffer fills up mid-stream, then space comes back: real broker and
``fedstream ingest`` process, the buffer on a small tmpfs filled by a ballast file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.brokers import EmbeddedBroker, MosquittoBroker
from deploy.local import ProcessGroup, wait_until
from deploy.probes import (
    DISK_FULL_S,
    SMALL_DISK_MB,
    MqttProbe,
    fill_disk,
    publish_report,
    small_disk,
    start_ingest,
    start_publisher,
)
from deploy.probes import buffer_stats as stats
from edge_client.wire.topics import status_topic


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with small_disk(tmp_path, SMALL_DISK_MB) as mount:
            yield mount
    except OSError as err:
        pytest.skip(f"needs root to mount a small tmpfs: {err}")


def test_a_full_disk_holds_messages_with_a_clear_error_and_recovers(
    broker: EmbeddedBroker | MosquittoBroker, procs: ProcessGroup, disk: Path
) -> None:
    # Prepare: a daemon writing to the small disk; its status watched as an operator would.
    buf = disk / "dev-a.sqlite"
    start_ingest(procs, broker.url, buf)
    watcher = MqttProbe(broker.url, "watcher")
    watcher.subscribe(status_topic("dev-a"))
    pub = start_publisher(
        procs, broker.url, "dev-a", "--rate", "400", "--batch", "4", "--duration", "10"
    )
    assert wait_until(lambda: stats(buf)["accepted"] >= 400, 20)
    # Execute: the disk fills up; 3 s after the daemon reports it, the ballast is deleted.
    ballast = fill_disk(disk)
    assert wait_until(lambda: "error" in watcher.last_json(), 15)
    full_status = watcher.last_json()
    time.sleep(DISK_FULL_S)
    ballast.unlink()
    report = publish_report(pub)
    # Assert: while full, the daemon stayed up, held the messages unacknowledged, and said
    # why in its log and its retained status; once space came back every sample arrived once.
    assert procs.procs["ingest"].poll() is None
    assert "cannot write the buffer" in full_status["error"]
    assert "full" in full_status["error"] or "I/O" in full_status["error"]
    log = buf.with_suffix(".log").read_text()
    assert "cannot write the buffer" in log and "retrying" in log
    assert report["acknowledged"] == report["messages"]
    assert wait_until(lambda: stats(buf)["accepted"] == report["samples"], 30)
    assert stats(buf)["received"] == report["samples"] and stats(buf)["rejected"] == 0
    assert wait_until(lambda: "error" not in watcher.last_json(), 15)
    assert json.loads(watcher.messages[-1].payload)["online"] is True
    watcher.close()
