"""The operator's fleet view: every device's retained status from the broker, as rows of a
table (``fedstream fleet``), JSON, or Prometheus metrics.

Each ingest daemon publishes its status, retained, on ``fedstream/v1/<device>/status`` every
``--status-interval``, and its broker publishes ``{"online": false}`` there when it goes away
(its will). :class:`FleetView` subscribes to all of them; a status that lacks a key keeps the
last value known, so a device gone offline still shows its last counters and when it was seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import paho.mqtt.client as mqtt

from deploy.subscriber import BrokerSubscriber
from edge_client.runtime.mqtt import BrokerURL
from edge_client.runtime.status_metrics import status_number
from edge_client.wire.topics import STATUS_WILDCARD, device_of_topic

__all__ = ["FleetView", "fleet_rows"]

log = logging.getLogger(__name__)

#: Seconds without a new retained status after which the first read counts as complete.
_QUIET_S = 0.5


class FleetView(BrokerSubscriber):
    """Every device's latest status, kept current from the broker.

    Parameters
    ----------
    broker : BrokerURL
        Where the devices publish; a :class:`~edge_client.runtime.mqtt.BrokerOptions` gives
        the credentials (the account must be allowed to read ``fedstream/v1/+/status``), the
        CA, and a client certificate where the broker requires one.
    """

    def __init__(self, broker: BrokerURL) -> None:
        super().__init__(broker, (STATUS_WILDCARD,), "fedstream-fleet")
        self._statuses: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._last_message = time.monotonic()
        #: Status messages that were not a JSON object (ignored).
        self.malformed = 0

    def wait_settled(self, timeout: float = 5.0) -> None:
        """After :meth:`wait_connected`: wait until the retained statuses have come in (none
        new for half a second since the subscription's acknowledgement), at most
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if time.monotonic() - self._last_message >= _QUIET_S:
                return
            time.sleep(0.05)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Device id -> its status as last known (copies)."""
        with self._lock:
            return {device: dict(status) for device, status in self._statuses.items()}

    def on_subscribed(self) -> None:
        """The retained statuses follow: the quiet period counts from here."""
        self._last_message = time.monotonic()

    def on_message(self, msg: mqtt.MQTTMessage) -> None:
        """Merge a device's status into what is known of it (a malformed one is counted)."""
        self._last_message = time.monotonic()
        device = device_of_topic(msg.topic)
        try:
            status = json.loads(msg.payload)
            if not isinstance(status, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            self.malformed += 1
            log.warning("ignored a malformed status on %s: %s", msg.topic, err)
            return
        if device is None:
            return
        with self._lock:
            self._statuses[device] = {**self._statuses.get(device, {}), **status}


def fleet_rows(statuses: Mapping[str, Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """One row per device, sorted by id: what ``fedstream fleet`` shows.

    Parameters
    ----------
    statuses : Mapping
        Device id -> status (:meth:`FleetView.snapshot`).
    now : float
        Unix time the ages are measured to.

    Returns
    -------
    list of dict
        Kebab-case keys: ``device``, ``online``, ``rate``, ``fill``, ``capacity``,
        ``accepted``, ``dropped``, ``refused`` and ``refused-by-reason``,
        ``messages-missing`` and ``readings-missing`` (what never arrived: gaps in
        publishers' sequence numbers, readings missing at the declared rate),
        ``last-seen-s`` (None when never seen), ``drift`` (changes detected),
        ``sensors-offline`` (availability topics not ``online``, and a Sparkplug B edge
        node or device after its death; None when the device follows none),
        ``mqtt-version``, ``error`` (each None where unknown).
    """
    rows = []
    for device, s in sorted(statuses.items()):
        by_reason = s.get("rejected-by-reason")
        reasons = {
            str(k): int(v)
            for k, v in (by_reason.items() if isinstance(by_reason, dict) else ())
            if status_number(v) is not None
        }
        drift = s.get("drift")
        ts = status_number(s.get("ts"))
        error = s.get("error")
        rows.append(
            {
                "device": device,
                "online": s.get("online") is True,
                "rate": status_number(s.get("rate")),
                "fill": _count(s.get("fill")),
                "capacity": _count(s.get("capacity")),
                "accepted": _count(s.get("accepted")),
                "dropped": _count(s.get("dropped")),
                "refused": _count(s.get("rejected", sum(reasons.values()))),
                "refused-by-reason": reasons,
                "messages-missing": _count(s.get("messages-missing")),
                "readings-missing": _count(s.get("readings-missing")),
                "last-seen-s": None if ts is None else round(now - ts, 1),
                "drift": _count(drift.get("changes")) if isinstance(drift, dict) else None,
                "sensors-offline": _offline(s),
                "mqtt-version": None if s.get("mqtt-version") is None else str(s["mqtt-version"]),
                "error": None if error is None else str(error),
            }
        )
    return rows


def _offline(status: Mapping[str, Any]) -> list[str] | None:
    """The sensors a status says are away: availability topics whose last state is not
    ``online``, a Sparkplug B device or edge node after its death."""
    offline = status.get("sensors-offline")
    spb = status.get("sparkplug")
    if not isinstance(offline, list) and not isinstance(spb, dict):
        return None
    out = [str(t) for t in offline] if isinstance(offline, list) else []
    if isinstance(spb, dict) and (spb.get("online") is False or spb.get("node-online") is False):
        out.append(f"sparkplug {spb.get('edge-node')}/{spb.get('device') or '-'}")
    return out


def _count(value: object) -> int | None:
    number = status_number(value)
    return None if number is None else int(number)
