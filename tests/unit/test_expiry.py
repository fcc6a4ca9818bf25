"""Messages outlive their run when an aggregator crashes: a device refuses one past its TTL
(the round's timeout) before it takes a sample."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import Message

from aggregator.server_app import run_rounds
from deploy.inprocess import InProcessGrid, VirtualDevice
from edge_client.wire.run_config import RunSettings


class StaleGrid(InProcessGrid):
    """Delivers every message as a dead run's queued message reaches a device: after its
    TTL ran out."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            msg.metadata.created_at -= msg.metadata.ttl + 60.0
        return super().push_messages(messages)


def test_an_expired_message_is_refused_without_taking_samples(
    tmp_path: Path, fast: Callable[..., RunSettings], fleet: Callable[..., list[VirtualDevice]]
) -> None:
    # Prepare: messages carry the round's timeout as their TTL.
    settings = fast(num_rounds=1, controller_probe=0, round_timeout=30.0)
    grid = StaleGrid(fleet(1, 1), tmp_path, settings)
    try:
        # Execute
        (record,) = run_rounds(grid, settings)
        consumed = [store.stats()["consumed"] for store in grid.stores.values()]
    finally:
        grid.close()
    # Assert: every device refused (counted as a failure), none spent a sample, the model
    # was kept.
    assert record.skipped == "no-replies" and record.devices == {}
    assert sum(record.failed.values()) == 2
    assert consumed == [0, 0]


def test_a_current_message_carries_the_rounds_timeout_as_its_ttl(
    tmp_path: Path, fast: Callable[..., RunSettings], fleet: Callable[..., list[VirtualDevice]]
) -> None:
    # Prepare
    settings = fast(num_rounds=1, controller_probe=0, round_timeout=30.0)
    ttls: list[float] = []

    class Watching(InProcessGrid):
        def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
            messages = list(messages)
            ttls.extend(m.metadata.ttl for m in messages)
            return super().push_messages(messages)

    grid = Watching(fleet(1, 1), tmp_path, settings)
    try:
        # Execute
        (record,) = run_rounds(grid, settings)
    finally:
        grid.close()
    # Assert: delivered in time, trained on.
    assert ttls == [30.0, 30.0] and set(record.devices) == {"dev-0", "dev-1"}
