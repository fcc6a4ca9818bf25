"""MQTT topics, device ids and client ids: where samples, statuses and shared samples
travel, and as whom each process of a device connects."""

from __future__ import annotations

import re

from edge_client.wire.constants import (
    CLIENT_ID_MAX_BYTES,
    CLIENT_ID_SEPARATOR,
    CLIENT_ROLES,
    DEVICE_ID_PATTERN,
    TOPIC_MAX_SLASHES,
    TOPIC_ROOT,
)

__all__ = [
    "STATUS_WILDCARD",
    "check_topic",
    "client_id",
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


def check_topic(topic: str) -> str:
    """Return ``topic`` if every broker takes it: not empty, no wildcard, at most
    :data:`~edge_client.wire.constants.TOPIC_MAX_SLASHES` '/' (AWS IoT Core's limit).

    Raises
    ------
    ValueError
        Saying which rule it breaks.
    """
    if not topic or "+" in topic or "#" in topic:
        raise ValueError(f"topic {topic!r} must be non-empty, without wildcards")
    if topic.count("/") > TOPIC_MAX_SLASHES:
        raise ValueError(
            f"topic {topic!r} has {topic.count('/')} '/': AWS IoT Core refuses more than "
            f"{TOPIC_MAX_SLASHES}"
        )
    return topic


def client_id(device_id: str, role: str, instance: str = "") -> str:
    """The MQTT client id a process of a device connects with: ``<device>.<role>`` (and
    ``.<instance>`` where a device runs several, e.g. publishers).

    Every process has its own (a broker closes the older of two connections with one id,
    and with it a session); all begin with the device id and a ``.``, which no device id
    holds, so a broker's policy can allow a device exactly its own: AWS IoT Core's
    ``client/${iot:Connection.Thing.ThingName}.*``.

    Raises
    ------
    ValueError
        If the device id or role is invalid, or the id is longer than AWS IoT Core takes.
    """
    if role not in CLIENT_ROLES:
        raise ValueError(f"client role {role!r} is none of {CLIENT_ROLES}")
    parts = [validate_device_id(device_id), role, *([instance] if instance else [])]
    made = CLIENT_ID_SEPARATOR.join(parts)
    if len(made.encode()) > CLIENT_ID_MAX_BYTES:
        raise ValueError(f"client id {made!r:.80} is over {CLIENT_ID_MAX_BYTES} bytes")
    return made
