"""A full buffer under each policy, with real broker and daemon processes: the overflow is
dropped and counted by the policy's rule, nothing is lost from the accounting, the daemon
stays up and keeps ingesting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.local import ProcessGroup, wait_until
from deploy.probes import buffer_stats as stats
from deploy.probes import publish_report, start_ingest, start_publisher
from edge_client.runtime.buffer import BufferStore

CAPACITY = 500


@pytest.mark.parametrize("policy", ["truncation", "persistence"])
def test_a_full_buffer_drops_by_its_policy_and_counts_every_sample(
    policy: str, broker: Any, procs: ProcessGroup, tmp_path: Path
) -> None:
    # Prepare: a 500-sample buffer; 2,000 samples arrive (timestamps increase with order)
    buf = tmp_path / "dev-a.sqlite"
    start_ingest(procs, broker.url, buf, "dev-a", "--policy", policy, "--capacity", str(CAPACITY))
    # Execute
    pub = start_publisher(
        procs, broker.url, "dev-a", "--count", "2000", "--rate", "4000", "--batch", "10"
    )
    report = publish_report(pub)
    assert wait_until(lambda: stats(buf)["received"] == 2000, 30)
    # Assert: the buffer is at capacity; every sample over it is dropped and counted
    # (truncation accepts and then evicts the oldest, persistence refuses the newest).
    s = stats(buf)
    assert report["acknowledged"] == report["messages"] == 200
    assert s["fill"] == CAPACITY and s["dropped"] == 2000 - CAPACITY and s["rejected"] == 0
    assert s["accepted"] == (2000 if policy == "truncation" else CAPACITY)
    with BufferStore(buf) as store:
        kept = store.take(CAPACITY)
    ts = kept.ts.tolist()
    assert ts == sorted(ts) and len(ts) == CAPACITY
    pub2 = start_publisher(
        procs,
        broker.url,
        "dev-a",
        "--count",
        "100",
        "--rate",
        "1000",
        "--batch",
        "10",
        "--seed",
        "1",
        name="pub2",
    )
    publish_report(pub2)
    # the daemon is up and, now that the buffer was emptied, takes new samples again
    assert wait_until(lambda: stats(buf)["fill"] == 100, 30)
    assert procs.procs["ingest"].poll() is None
