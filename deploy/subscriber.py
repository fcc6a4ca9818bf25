"""A short-lived subscriber of the operator's tools (``fedstream fleet``, ``fedstream
sensors``): connects to the broker (retrying with back-off, in paho's thread), subscribes to
its topic filters, and hands each message to the subclass.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from typing import Any, Self

import paho.mqtt.client as mqtt

from deploy.local import StartStop
from edge_client.runtime.mqtt import (
    BrokerURL,
    Connection,
    Subscriptions,
    connect_async,
    make_client,
)

__all__ = ["BrokerSubscriber"]


class BrokerSubscriber(StartStop):
    """Subscribes to ``filters`` on ``broker`` and calls :meth:`on_message` for each message
    (in paho's thread).

    Parameters
    ----------
    broker : BrokerURL
        The broker; a :class:`~edge_client.runtime.mqtt.BrokerOptions` gives the
        credentials, the CA, and a client certificate where the broker requires one.
    filters : sequence of str
        What to subscribe to.
    name : str
        The client id's prefix: each subscriber takes an id of its own (a second one takes
        none over, and no device's is ever used).
    """

    def __init__(self, broker: BrokerURL, filters: Sequence[str], name: str) -> None:
        self.broker = broker
        self._subscribed = threading.Event()
        self._client = make_client(f"{name}.{secrets.token_hex(4)}", broker)
        self._subscriptions = Subscriptions(tuple(filters))
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        #: The attempts to reach the broker (from :meth:`start` on).
        self.connection = Connection(v5=self._client.protocol == mqtt.MQTTv5)

    def start(self) -> Self:
        """Connect (retrying with back-off) and subscribe, in paho's thread."""
        connect_async(self._client, self.broker, self.connection)
        return self

    def wait_connected(self, timeout: float) -> bool:
        """Block until subscribed (the broker acknowledged every filter: retained messages
        follow), or ``timeout`` seconds."""
        return self._subscribed.wait(timeout)

    def stop(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()

    def on_subscribed(self) -> None:
        """Called once the broker acknowledged the subscriptions, before waiters wake."""

    def on_message(self, msg: mqtt.MQTTMessage) -> None:
        """Called for each message (in paho's thread)."""
        raise NotImplementedError

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if rc.is_failure:
            self.connection.refused(self.broker, rc)
            return
        self._subscriptions.send(client)

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, mid: int, reasons: Any, _p: Any) -> None:
        if self._subscriptions.acknowledged(mid, reasons, self.connection):
            self.on_subscribed()
            self._subscribed.set()

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self.on_message(msg)
