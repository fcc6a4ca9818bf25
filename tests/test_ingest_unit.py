"""Ingest daemon pieces that need no broker."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from edge_client.ingest import IngestConfig, _RejectLog
from edge_client.mqtt import BrokerURL


def test_rejects_are_logged_once_per_reason_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    # Prepare
    log = _RejectLog(interval=60.0)
    caplog.set_level(logging.WARNING, logger="edge_client.ingest")
    # Execute: a flood of one reason, a new reason, then the first again after a minute.
    for t in range(50):
        log.record(Counter({"bad-magic": 3}), now=float(t))
    log.record(Counter({"non-finite": 1}), now=50.0)
    log.record(Counter({"bad-magic": 1}), now=61.0)
    # Assert
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "3 message(s) as bad-magic" in lines[0]
    assert "1 message(s) as non-finite" in lines[1]
    assert "148 message(s) as bad-magic" in lines[2]  # everything since the last line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"device_id": "a/b"}, "device id"), ({"status_interval": 0}, "status interval")],
)
def test_config_is_validated(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "broker": BrokerURL.parse("mqtt://127.0.0.1:1"),
        "device_id": "d",
        "buffer": "b.sqlite",
    }
    with pytest.raises(ValueError, match=message):
        IngestConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_broker_urls() -> None:
    assert BrokerURL.parse("mqtts://h") == BrokerURL("h", 8883, True)
    assert BrokerURL.parse("127.0.0.1:1884") == BrokerURL("127.0.0.1", 1884, False)
    for bad in ("http://h:1", "mqtt://:1883", "mqtt://h:99999"):
        with pytest.raises(ValueError, match="broker URL"):
            BrokerURL.parse(bad)
