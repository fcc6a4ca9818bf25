"""MQTT plumbing shared by every client (the ingest and inference daemons, the publisher,
the fleet view): broker URLs, how to connect (:class:`BrokerOptions`), clients and their
sessions, subscriptions, and the broker's refusals in words.

Clients speak MQTT 5 unless told otherwise (``--mqtt-version 3.1.1``, or
``FEDSTREAM_MQTT_VERSION``, for brokers that lack it, such as the embedded one). MQTT 5 is
what lets a burst through a broker nobody tuned: a 3.1.1 subscriber gets at most the
broker's in-flight limit of unacknowledged messages (Mosquitto's default: 20) and the broker
queues at most its queue limit behind them (1,000), dropping the rest, while an MQTT 5 client
says how many it takes (Receive Maximum). Sessions last a stated time (session expiry)
instead of 3.1.1's keep-forever or drop-now, and refusals come with a reason code.

Topics, device ids and client ids are part of the wire contract: :mod:`edge_client.wire.topics`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import struct
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_client.runtime.constants import (
    DEFAULT_MQTT_VERSION,
    KEEPALIVE_S,
    MQTT_5,
    MQTT_VERSION_ENV,
    MQTT_VERSIONS,
    PAHO_LOGGER,
    RECONNECT_MAX_DELAY_S,
    RECONNECT_MIN_DELAY_S,
    SUBSCRIBE_MAX_FILTERS,
)

__all__ = [
    "BrokerOptions",
    "BrokerURL",
    "Connection",
    "Subscriptions",
    "connect_async",
    "describe_connect_error",
    "describe_reason",
    "make_client",
    "mqtt_version",
    "unread_bytes",
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
    mqtt_version : {"5", "3.1.1"}, optional
        The protocol to speak (None: :func:`mqtt_version`'s default, MQTT 5 unless the
        environment says otherwise).

    Raises
    ------
    ValueError
        If a key is given without a certificate, the timeout is not positive, or the MQTT
        version is unknown.
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    connect_timeout: float | None = None
    mqtt_version: str | None = None

    def __post_init__(self) -> None:
        if self.keyfile and not self.certfile:
            raise ValueError("--keyfile needs --certfile (the client certificate)")
        if self.connect_timeout is not None and not self.connect_timeout > 0:
            raise ValueError(f"connect timeout must be > 0 s, got {self.connect_timeout}")
        if self.mqtt_version is not None and self.mqtt_version not in MQTT_VERSIONS:
            raise ValueError(
                f"MQTT version {self.mqtt_version!r} is none of {', '.join(MQTT_VERSIONS)}"
            )

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

    @property
    def protocol(self) -> str:
        """The MQTT version the client speaks: ``mqtt_version``, or :func:`mqtt_version`.

        Raises
        ------
        ValueError
            If it comes from an environment variable that holds no known version.
        """
        return self.mqtt_version or mqtt_version()


def mqtt_version() -> str:
    """The MQTT version clients speak unless told: ``$FEDSTREAM_MQTT_VERSION``, else 5.

    Raises
    ------
    ValueError
        If the environment variable holds no known version.
    """
    version = os.environ.get(MQTT_VERSION_ENV) or DEFAULT_MQTT_VERSION
    if version not in MQTT_VERSIONS:
        raise ValueError(f"{MQTT_VERSION_ENV}={version!r} is none of {', '.join(MQTT_VERSIONS)}")
    return version


def make_client(
    client_id: str,
    broker: BrokerURL,
    *,
    session_expiry: int = 0,
    manual_ack: bool = False,
    receive_maximum: int | None = None,
) -> mqtt.Client:
    """A paho 2 client, MQTT 5 or 3.1.1 as ``broker`` says, with credentials, TLS, reconnect
    back-off and its session set, ready for :func:`connect_async`; it logs through Python
    logging (the ``paho.mqtt.client`` logger).

    Parameters
    ----------
    client_id : str
        Stable id: the broker keeps a session under it (one id per process: a second
        connection with the same id takes the session over).
    broker : BrokerURL
        Where to connect; a :class:`BrokerOptions` also says as whom, with which TLS files
        and which MQTT version.
    session_expiry : int
        Seconds the broker keeps the session (subscriptions, and QoS 1 messages that arrive
        meanwhile) after the client goes away; 0: it ends with the connection. MQTT 5's
        session expiry interval, resumed on every connect; under 3.1.1 any value above 0
        is a persistent session (clean session off), which the broker keeps as it likes.
    manual_ack : bool
        Acknowledge messages with ``client.ack`` instead of after the callback.
    receive_maximum : int, optional
        MQTT 5: the most QoS 1 messages the broker may send before this client
        acknowledges them (None: the protocol's default, 65,535). 3.1.1 has no such
        thing: the broker's own in-flight limit applies.

    Raises
    ------
    ValueError
        If a TLS file cannot be read or used, or the MQTT version is unknown.
    """
    if session_expiry < 0:
        raise ValueError(f"session expiry must be >= 0 s, got {session_expiry}")
    options = BrokerOptions.of(broker)
    if options.protocol == MQTT_5:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            manual_ack=manual_ack,
            protocol=mqtt.MQTTv5,
        )
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        if session_expiry:
            properties.SessionExpiryInterval = session_expiry
        if receive_maximum is not None:
            properties.ReceiveMaximum = receive_maximum
        # clean start off: resume the session on every connect
        _SESSIONS[client] = (session_expiry == 0, properties)
    else:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=session_expiry == 0,
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


#: An MQTT 5 client's CONNECT: its clean start flag and properties (connect_async sends them).
_SESSIONS: weakref.WeakKeyDictionary[mqtt.Client, tuple[bool, Properties]] = (
    weakref.WeakKeyDictionary()
)


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


#: What an operator can do about a refusal, by reason code (MQTT 5 codes; paho reports a
#: 3.1.1 CONNACK's refusals under the same codes).
_REASON_HINTS = {
    0x85: "the broker refused the client id: fedstream's are <device-id>.<role>, allow those",
    0x86: "check --username and --password",
    0x87: "the broker's ACL or policy does not allow this client, client id or topic",
    0x8E: "another connection took this client id over: give each process its own",
    0x95: "a message was larger than the broker takes: lower --max-payload",
    0x97: "the broker's quota for this client is used up",
}
#: Under MQTT 5 only: a 3.1.1 broker's "unsupported protocol version" means 3.1.1 itself.
_NOT_V5 = "the broker does not speak MQTT 5: run with --mqtt-version 3.1.1"


def describe_reason(reason: ReasonCode, v5: bool) -> str:
    """A broker's reason code in words: its name, under MQTT 5 its number, and what to do
    where that is known (e.g. "Not authorized (MQTT 5 reason code 0x87): the broker's ACL
    ...")."""
    value = int(reason.value)
    text = reason.getName()
    if v5:
        text += f" (MQTT 5 reason code {value:#04x})"
    hint = _NOT_V5 if v5 and value == 0x84 else _REASON_HINTS.get(value)
    return f"{text}: {hint}" if hint else text


@dataclass
class Connection:
    """What is known of a client's attempts to reach its broker.

    Attributes
    ----------
    failures : int
        Attempts that failed so far (first connection and reconnections).
    last_error : str or None
        Why the last one failed, in words (None: none failed).
    v5 : bool
        Whether the client speaks MQTT 5 (its reasons then carry their codes).
    """

    failures: int = 0
    last_error: str | None = None
    v5: bool = False
    _answered: bool = field(default=False, repr=False)  # this attempt had its CONNACK

    def refused(self, broker: BrokerURL, reason: ReasonCode) -> None:
        """The broker answered and refused (bad credentials, not authorised): log it."""
        self.failures += 1
        self.last_error = f"the broker refused the connection: {describe_reason(reason, self.v5)}"
        log.error("cannot connect to %s: %s", broker, self.last_error)

    def closed_unanswered(self, broker: BrokerURL) -> None:
        """The broker closed the connection before it answered the CONNECT: log why that
        may be (under MQTT 5, most likely a broker that speaks only 3.1.1)."""
        self.failures += 1
        self.last_error = "the broker closed the connection without answering" + (
            " an MQTT 5 CONNECT: if it speaks only MQTT 3.1.1 (fedstream's embedded broker, "
            "Mosquitto before 1.6), run with --mqtt-version 3.1.1"
            if self.v5
            else ""
        )
        log.warning(
            "cannot connect to %s: %s (attempt %d; retrying)",
            broker,
            self.last_error,
            self.failures,
        )


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


def connect_async(
    client: mqtt.Client, broker: BrokerURL, state: Connection | None = None
) -> Connection:
    """Start connecting in the background, with the session :func:`make_client` gave the
    client; paho's loop thread retries with back-off.

    A daemon whose callbacks read its connection passes ``state`` (made before this call):
    paho's thread may connect and call them before this function returns.

    Every failed attempt (the first connection or a reconnection) is logged with its reason
    (refused, DNS, TLS verification, closed unanswered, ...), which the returned
    :class:`Connection` also holds. The client's ``on_connect`` and ``on_disconnect``, set
    before this call, are called as before; on each CONNACK the client also keeps its QoS 1
    messages in flight within the broker's Receive Maximum (MQTT 5: AWS IoT Core takes 100).
    """
    state = state or Connection(v5=client.protocol == mqtt.MQTTv5)
    wanted_inflight = client.max_inflight_messages
    # paho types its callbacks for both its callback APIs: ours are version 2's.
    user_connect: Any = client.on_connect
    user_disconnect: Any = client.on_disconnect

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

    def on_pre_connect(_client: mqtt.Client, _userdata: object) -> None:
        state._answered = False

    def on_connect(c: mqtt.Client, u: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        state._answered = True
        limit = getattr(props, "ReceiveMaximum", None) if not rc.is_failure else None
        if wanted_inflight:
            # paho takes no new limit on an open connection (its setter refuses), and sends
            # what it queued right after this callback, within its own field: set that.
            c._max_inflight_messages = min(wanted_inflight, int(limit or wanted_inflight))
        if user_connect is not None:
            user_connect(c, u, flags, rc, props)

    def on_disconnect(c: mqtt.Client, u: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        if not state._answered:
            state.closed_unanswered(broker)
            state._answered = True
        if user_disconnect is not None:
            user_disconnect(c, u, flags, rc, props)

    client.on_connect_fail = on_fail
    client.on_pre_connect = on_pre_connect
    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    clean_start, properties = _SESSIONS.get(client, (True, None))
    client.connect_async(
        broker.host, broker.port, keepalive=KEEPALIVE_S, clean_start=clean_start,
        properties=properties,
    )  # fmt: skip
    client.loop_start()
    return state


class Subscriptions:
    """A client's subscriptions: sent in packets of at most
    :data:`~edge_client.runtime.constants.SUBSCRIBE_MAX_FILTERS` filters (AWS IoT Core's
    limit), and whether the broker granted each.

    Parameters
    ----------
    topics : sequence of str
        The topic filters, all at QoS 1.
    """

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self._pending: dict[int, tuple[str, ...]] = {}
        #: Topic filter -> the broker's reason, for the filters it refused.
        self.refused: dict[str, str] = {}

    def send(self, client: mqtt.Client) -> None:
        """Subscribe (again: on every connect) to every topic."""
        self._pending.clear()
        self.refused.clear()
        for at in range(0, len(self.topics), SUBSCRIBE_MAX_FILTERS):
            chunk = self.topics[at : at + SUBSCRIBE_MAX_FILTERS]
            _rc, mid = client.subscribe([(topic, 1) for topic in chunk])
            if mid is not None:
                self._pending[mid] = chunk

    def acknowledged(
        self, mid: int, reasons: Sequence[ReasonCode], connection: Connection
    ) -> bool | None:
        """Take the SUBACK of packet ``mid``; return None while others are due, then True
        when the broker granted every filter and False when it refused any: then the
        connection's ``last_error`` and an error in the log say which and why."""
        chunk = self._pending.pop(mid, ())
        for topic, reason in zip(chunk, reasons, strict=False):
            if reason.is_failure:
                self.refused[topic] = describe_reason(reason, connection.v5)
        if self._pending:
            return None
        if self.refused:
            connection.last_error = f"the broker refused to subscribe: {self.describe_refusals()}"
            log.error("%s", connection.last_error)
        return not self.refused

    def describe_refusals(self) -> str:
        """The refused filters and the broker's reasons, in one line."""
        return "; ".join(f"{topic}: {why}" for topic, why in self.refused.items())


def unread_bytes(client: mqtt.Client) -> int:
    """Bytes that arrived on the client's socket and wait to be read (0 when not connected,
    or where the system cannot tell: FIONREAD is Unix's)."""
    sock = client.socket()
    if sock is None:
        return 0
    try:
        import fcntl
        import termios
    except ImportError:  # not on Unix
        return 0
    with contextlib.suppress(OSError, ValueError):  # closed meanwhile
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", raw)[0])
    return 0
