"""MQTT plumbing shared by the ingest daemon and the publisher: broker URLs and clients.

Topics and device ids are part of the wire contract: :mod:`edge_client.wire.topics`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_client.runtime.constants import KEEPALIVE_S, RECONNECT_MAX_DELAY_S, RECONNECT_MIN_DELAY_S

__all__ = ["BrokerURL", "connect_async", "make_client"]


@dataclass(frozen=True)
class BrokerURL:
    """A broker address ``mqtt://host:port`` (plain) or ``mqtts://host:port`` (TLS)."""

    host: str
    port: int
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        """Parse ``mqtt://HOST[:PORT]`` or ``mqtts://HOST[:PORT]``.

        Raises
        ------
        ValueError
            If the scheme, host or port is missing or invalid.
        """
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = parts.scheme in ("mqtts", "ssl")
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError as err:
            raise ValueError(f"broker URL {url!r}: bad port") from err
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r}: no host")
        return cls(parts.hostname, port, tls)

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def make_client(
    client_id: str,
    broker: BrokerURL,
    *,
    clean_session: bool = True,
    manual_ack: bool = False,
    username: str | None = None,
    password: str | None = None,
    cafile: str | None = None,
) -> mqtt.Client:
    """A paho 2 client (MQTT 3.1.1) with credentials, TLS and reconnect back-off set.

    Parameters
    ----------
    client_id : str
        Stable id; with ``clean_session=False`` the broker keeps the session under it.
    broker : BrokerURL
        Where to connect (connect with :func:`connect_async` + ``loop_start``).
    clean_session : bool
        False keeps subscriptions and queued QoS 1 messages while the client is away.
    manual_ack : bool
        Acknowledge messages with ``client.ack`` instead of after the callback.
    username, password : str, optional
        Broker credentials.
    cafile : str, optional
        CA bundle for TLS; given alone it also switches TLS on.
    """
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        manual_ack=manual_ack,
        protocol=mqtt.MQTTv311,
    )
    if username is not None:
        client.username_pw_set(username, password)
    if broker.tls or cafile:
        client.tls_set(ca_certs=cafile, cert_reqs=ssl.CERT_REQUIRED)
    client.reconnect_delay_set(RECONNECT_MIN_DELAY_S, RECONNECT_MAX_DELAY_S)
    return client


def connect_async(client: mqtt.Client, broker: BrokerURL) -> None:
    """Start connecting in the background; paho's loop thread retries with back-off."""
    client.connect_async(broker.host, broker.port, keepalive=KEEPALIVE_S)
    client.loop_start()
