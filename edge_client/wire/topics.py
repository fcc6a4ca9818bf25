"""MQTT topics and device ids: where samples, statuses and shared samples travel."""

from __future__ import annotations

import re

from edge_client.wire.constants import DEVICE_ID_PATTERN, TOPIC_ROOT

__all__ = [
    "STATUS_WILDCARD",
    "device_of_topic",
    "predictions_topic",
    "samples_topic",
    "status_topic",
    "validate_device_id",
]

#: Every device's status topic (what a fleet view subscribes to).
STATUS_WILDCARD = f"{TOPIC_ROOT}/+/status"

_DEVICE_ID_RE = re.compile(DEVICE_ID_PATTERN)


def validate_device_id(device_id: str) -> str:
    """Return ``device_id`` if it matches ``[A-Za-z0-9_-]{1,64}``, else raise ValueError."""
    if not isinstance(device_id, str) or not _DEVICE_ID_RE.fullmatch(device_id):
        raise ValueError(f"device id {device_id!r:.80} must match {DEVICE_ID_PATTERN}")
    return device_id


def samples_topic(device_id: str) -> str:
    """Topic a device's samples are published on."""
    return f"{TOPIC_ROOT}/{validate_device_id(device_id)}/samples"


def status_topic(device_id: str) -> str:
    """Topic of a device's retained ingest status."""
    return f"{TOPIC_ROOT}/{validate_device_id(device_id)}/status"


def predictions_topic(device_id: str) -> str:
    """Topic a device's ``fedstream infer`` publishes its predictions on."""
    return f"{TOPIC_ROOT}/{validate_device_id(device_id)}/predictions"


def device_of_topic(topic: str) -> str | None:
    """The device id in a ``fedstream/v1/<device>/...`` topic (None for any other topic)."""
    root, _, rest = topic.partition(f"{TOPIC_ROOT}/")
    device = rest.split("/", 1)[0]
    if root or not _DEVICE_ID_RE.fullmatch(device):
        return None
    return device
