"""MQTT plumbing shared by every client (the ingest and inference daemons, the publisher, the
fleet view): broker URLs, how to connect (:class:`BrokerOptions`) and clients.

Topics and device ids are part of the wire contract: :mod:`edge_client.wire.topics`.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_client.runtime.constants import (
    KEEPALIVE_S,
    PAHO_LOGGER,
    RECONNECT_MAX_DELAY_S,
    RECONNECT_MIN_DELAY_S,
)

__all__ = [
    "BrokerOptions",
    "BrokerURL",
    "Connection",
    "connect_async",
    "describe_connect_error",
    "make_client",
]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class BrokerOptions(BrokerURL):
    """A broker and how to reach it: its address, the credentials, the TLS files and how long
    the first connection may take.

    Every MQTT client of fedstream takes one (the ingest and inference daemons, the publisher,
    the fleet view). It is a :class:`BrokerURL` (what a plain address gives: anonymous, the
    system's CAs for ``mqtts://``, retrying for ever), so a configuration's ``broker`` field
    takes either; ``str()`` is the address alone (no secret in a log line).

    Attributes
    ----------
    username, password : str, optional
        Broker credentials.
    cafile : str, optional
        CA bundle for TLS; given alone it also switches TLS on.
    certfile, keyfile : str, optional
        This client's certificate and its key (PEM), for brokers that authenticate clients
        by certificate (Mosquitto's ``require_certificate``, AWS IoT); they switch TLS on.
    connect_timeout : float, optional
        Seconds the first connection may take before the client gives up with the reason
        (None: keep retrying; each client says what it does then).

    Raises
    ------
    ValueError
        If a key is given without a certificate, or the timeout is not positive.
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    connect_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.keyfile and not self.certfile:
            raise ValueError("--keyfile needs --certfile (the client certificate)")
        if self.connect_timeout is not None and not self.connect_timeout > 0:
            raise ValueError(f"connect timeout must be > 0 s, got {self.connect_timeout}")

    @classmethod
    def of(cls, broker: BrokerURL | str, **options: str | float | None) -> BrokerOptions:
        """``broker`` (a URL, parsed or not) with ``options`` (the attributes' names).

        Raises
        ------
        ValueError
            If the URL or an option is invalid.
        """
        url = BrokerURL.parse(broker) if isinstance(broker, str) else broker
        if isinstance(url, BrokerOptions):
            return replace(url, **options)  # type: ignore[arg-type]
        return cls(url.host, url.port, url.tls, **options)  # type: ignore[arg-type]

    @property
    def url(self) -> BrokerURL:
        """The broker's address alone."""
        return BrokerURL(self.host, self.port, self.tls)

    @property
    def uses_tls(self) -> bool:
        """Whether the connection is TLS: ``mqtts://``, or any TLS file given."""
        return self.tls or bool(self.cafile or self.certfile)


def make_client(
    client_id: str,
    broker: BrokerURL,
    *,
    clean_session: bool = True,
    manual_ack: bool = False,
) -> mqtt.Client:
    """A paho 2 client (MQTT 3.1.1) with credentials, TLS and reconnect back-off set, that
    logs through Python logging (the ``paho.mqtt.client`` logger).

    Parameters
    ----------
    client_id : str
        Stable id; with ``clean_session=False`` the broker keeps the session under it.
    broker : BrokerURL
        Where to connect (connect with :func:`connect_async` + ``loop_start``); a
        :class:`BrokerOptions` also says as whom and with which TLS files.
    clean_session : bool
        False keeps subscriptions and queued QoS 1 messages while the client is away.
    manual_ack : bool
        Acknowledge messages with ``client.ack`` instead of after the callback.

    Raises
    ------
    ValueError
        If a TLS file cannot be read or used.
    """
    options = BrokerOptions.of(broker)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        manual_ack=manual_ack,
        protocol=mqtt.MQTTv311,
    )
    if options.username is not None:
        client.username_pw_set(options.username, options.password)
    if options.uses_tls:
        cafile, certfile, keyfile = options.cafile, options.certfile, options.keyfile
        try:
            client.tls_set(
                ca_certs=cafile, certfile=certfile, keyfile=keyfile, cert_reqs=ssl.CERT_REQUIRED
            )
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            raise ValueError(f"TLS files ({cafile=}, {certfile=}, {keyfile=}): {err}") from err
    client.reconnect_delay_set(RECONNECT_MIN_DELAY_S, RECONNECT_MAX_DELAY_S)
    # paho's own log (packets at DEBUG, errors in callbacks at ERROR) through Python logging.
    client.enable_logger(_paho_logger())
    return client


class _PahoLevels(logging.Filter):
    """paho logs one benign event as an error: its network loop running once more after a
    clean ``disconnect()`` ("Client is not connected"). That record is filed at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(
            "Client is not connected"
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _paho_logger() -> logging.Logger:
    logger = logging.getLogger(PAHO_LOGGER)
    if not any(isinstance(f, _PahoLevels) for f in logger.filters):
        logger.addFilter(_PahoLevels())
    return logger


@dataclass
class Connection:
    """What is known of a client's attempts to reach its broker.

    Attributes
    ----------
    failures : int
        Attempts that failed so far (first connection and reconnections).
    last_error : str or None
        Why the last one failed, in words (None: none failed).
    """

    failures: int = 0
    last_error: str | None = None

    def refused(self, broker: BrokerURL, reason: object) -> None:
        """The broker answered and refused (bad credentials, not authorised): log it."""
        self.failures += 1
        self.last_error = f"the broker refused the connection: {reason}"
        log.error("cannot connect to %s: %s", broker, self.last_error)


def describe_connect_error(err: BaseException | None, broker: BrokerURL) -> str:
    """Why a connection to ``broker`` failed, in words an operator can act on."""
    where = f"{broker.host}:{broker.port}"
    if isinstance(err, ssl.SSLCertVerificationError):
        return (
            f"TLS: the broker's certificate failed verification when dialling {broker.host!r} "
            f"({err.verify_message}); check --cafile and that the certificate names this host"
        )
    if isinstance(err, ssl.SSLError):
        return f"TLS: {err.reason or err}"
    if isinstance(err, socket.gaierror):
        return f"DNS: cannot resolve {broker.host!r} ({err.strerror})"
    if isinstance(err, ConnectionRefusedError):
        return f"refused: nothing accepts connections at {where}"
    if isinstance(err, TimeoutError):
        return f"timed out connecting to {where}"
    if isinstance(err, OSError):
        return f"{type(err).__name__}: {err.strerror or err}"
    return "unknown reason" if err is None else f"{type(err).__name__}: {err}"


def connect_async(client: mqtt.Client, broker: BrokerURL) -> Connection:
    """Start connecting in the background; paho's loop thread retries with back-off.

    Every failed attempt (the first connection or a reconnection) is logged with its reason
    (refused, DNS, TLS verification, ...), which the returned :class:`Connection` also holds.
    """
    state = Connection()

    def on_fail(_client: mqtt.Client, _userdata: object) -> None:
        # paho calls this inside its `except OSError`: the exception is the current one
        state.failures += 1
        state.last_error = describe_connect_error(sys.exc_info()[1], broker)
        log.warning(
            "cannot connect to %s: %s (attempt %d; retrying, at most every %d s)",
            broker,
            state.last_error,
            state.failures,
            RECONNECT_MAX_DELAY_S,
        )

    client.on_connect_fail = on_fail
    client.connect_async(broker.host, broker.port, keepalive=KEEPALIVE_S)
    client.loop_start()
    return state
