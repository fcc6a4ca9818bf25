"""MQTT brokers fedstream starts itself: the embedded iotcore (rumqttd) one, and Mosquitto."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Self

from deploy.constants import (
    EMBEDDED_BROKER_LOGGERS,
    EMBEDDED_MAX_INFLIGHT,
    EMBEDDED_MAX_PAYLOAD,
)
from deploy.extras import require_extra
from deploy.local import ProcessGroup, StartStop, free_port, wait_for_port
from edge_client.runtime.constants import MQTT_5, MQTT_311

if TYPE_CHECKING:  # the embedded broker is the demo extra's: imported where it is started
    from iotcore import Broker

__all__ = [
    "BROKER_CONFIG_DIR",
    "EmbeddedBroker",
    "MosquittoBroker",
    "embedded_broker",
    "mosquitto_available",
    "quiet_embedded_broker_log",
    "run_embedded_broker",
]

#: Persistence as in mosquitto-prod.conf, for configs without it (the path is rewritten).
PERSISTENCE = "\npersistence true\npersistence_location /var/lib/mosquitto/\nautosave_interval 1\n"

#: The repository's broker_config/ folder (Mosquitto configs, ACL, certificate script).
BROKER_CONFIG_DIR = Path(__file__).resolve().parent.parent / "broker_config"


def embedded_broker(port: int, listen: str = "127.0.0.1") -> Broker:
    """An iotcore broker, in a child process, with fedstream's settings.

    Raises
    ------
    MissingExtraError
        If iotcore (the ``demo`` extra) is not installed.
    """
    require_extra("the embedded broker", ("iotcore",))
    from iotcore import Broker

    return Broker(
        port=port,
        listen=listen,
        max_payload_size=EMBEDDED_MAX_PAYLOAD,
        max_inflight_count=EMBEDDED_MAX_INFLIGHT,
    )


class _AsDebug(logging.Handler):
    """Hands each record on to the root logger's handlers as a DEBUG record."""

    def emit(self, record: logging.LogRecord) -> None:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        root = logging.getLogger()
        if root.isEnabledFor(logging.DEBUG):
            root.handle(record)


def quiet_embedded_broker_log() -> None:
    """File the embedded broker's tracing at DEBUG in this process.

    rumqttd wraps its per-packet routing in ``error_span!``s, so its tracing reaches Python
    logging (the ``rumqttd`` and ``tracing`` loggers) as ERROR and INFO records for every
    packet. They are traces: with the root logger at DEBUG (``-v``) they are shown as DEBUG
    records; otherwise the loggers are set so that rumqttd does not even pass them to Python.
    """
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    for name in EMBEDDED_BROKER_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG if verbose else logging.CRITICAL)
        logger.propagate = False
        logger.handlers = [_AsDebug()]


def run_embedded_broker(port: int, listen: str = "127.0.0.1") -> None:
    """Run the embedded broker in this process until interrupted; its per-packet tracing is
    logged at DEBUG (:func:`quiet_embedded_broker_log`): set up logging first.

    The broker's loop is native code that never returns to Python, so it runs in a daemon
    thread while this one waits: signal handlers (and Ctrl-C) run here.

    Raises
    ------
    OSError
        If the port is taken.
    MissingExtraError
        If iotcore (the ``demo`` extra) is not installed.
    """
    require_extra("the embedded broker", ("iotcore",))
    from iotcore import IotCoreBroker

    native = IotCoreBroker(
        listen=listen,
        port=port,
        max_payload_size=EMBEDDED_MAX_PAYLOAD,
        max_inflight_count=EMBEDDED_MAX_INFLIGHT,
    )
    quiet_embedded_broker_log()
    native.check_ports()
    loop = threading.Thread(target=native.run_forever, name="embedded-broker", daemon=True)
    loop.start()
    while loop.is_alive():
        loop.join(0.5)


class EmbeddedBroker(StartStop):
    """The embedded broker in a child process, on a free port unless one is given.

    It speaks MQTT 3.1.1 only (rumqttd's v4 listener; it closes an MQTT 5 connection
    unanswered): its clients need ``--mqtt-version 3.1.1`` (:attr:`client_args`). It lets
    each client have :data:`~deploy.constants.EMBEDDED_MAX_INFLIGHT` messages in flight.
    """

    #: The MQTT version its clients speak.
    mqtt_version = MQTT_311

    def __init__(self, port: int | None = None, listen: str = "127.0.0.1") -> None:
        self.port = port or free_port()
        self.host = "127.0.0.1" if listen in ("0.0.0.0", "") else listen
        self._broker = embedded_broker(self.port, listen)

    @property
    def url(self) -> str:
        """``mqtt://host:port`` of the broker."""
        return f"mqtt://{self.host}:{self.port}"

    @property
    def client_args(self) -> list[str]:
        """The options of a ``fedstream`` command that connects to it."""
        return ["--broker", self.url, "--mqtt-version", self.mqtt_version]

    def start(self) -> Self:
        """Start and wait until it accepts connections."""
        self._broker.start()
        return self

    def stop(self) -> None:
        """Stop it and release the port."""
        self._broker.stop()


def mosquitto_available() -> bool:
    """True when the ``mosquitto`` binary is on PATH (or in /usr/sbin)."""
    return _mosquitto_binary() is not None


def _mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/bin")


class MosquittoBroker(StartStop):
    """A Mosquitto process started from one of the configs in ``broker_config/``.

    The config is copied with its ``listener`` ports replaced by free ones and any path
    under ``/etc/mosquitto/fedstream`` pointed at ``files_dir`` (certificates, password
    file, ACL made by ``broker_config/make-dev-certs.sh``).

    Parameters
    ----------
    config : Path
        A Mosquitto config file, e.g. ``broker_config/mosquitto-dev.conf``.
    files_dir : Path, optional
        Replaces ``/etc/mosquitto/fedstream`` in the config.
    persist : bool
        Turn persistence on (autosave every second, in its temporary folder) if the config
        does not: sessions and queued messages then outlive a restart, as in production.
    """

    #: The MQTT version its clients speak (Mosquitto 2 speaks 5, 3.1.1 and 3.1).
    mqtt_version = MQTT_5

    def __init__(
        self, config: Path | None = None, files_dir: Path | None = None, persist: bool = False
    ) -> None:
        binary = _mosquitto_binary()
        if binary is None:
            raise FileNotFoundError("mosquitto is not installed (apt-get install -y mosquitto)")
        self.binary = binary
        self.config = config or BROKER_CONFIG_DIR / "mosquitto-dev.conf"
        self.files_dir = files_dir
        self.persist = persist
        self.ports: list[int] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="fedstream-mosquitto-")
        self._group = ProcessGroup(grace=5.0)

    @classmethod
    def stock(cls) -> MosquittoBroker:
        """Mosquitto as a site runs it without tuning for fedstream: a listener and anonymous
        clients (which Mosquitto 2 refuses on a listener unless told), every limit at its
        default (20 messages in flight to a 3.1.1 client, 1,000 queued)."""
        broker = cls()
        broker.config = Path(broker._tmp.name) / "stock.conf"
        broker.config.write_text("listener 1883 127.0.0.1\nallow_anonymous true\n")
        return broker

    @property
    def port(self) -> int:
        """The first listener's port."""
        return self.ports[0]

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<first port>``."""
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def client_args(self) -> list[str]:
        """The options of a ``fedstream`` command that connects to it."""
        return ["--broker", self.url, "--mqtt-version", self.mqtt_version]

    def start(self) -> Self:
        """Write the adapted config, start Mosquitto, wait for every listener."""
        text = self.config.read_text()
        if self.files_dir is not None:
            text = text.replace("/etc/mosquitto/fedstream", str(self.files_dir))
        if self.persist and not re.search(r"(?m)^persistence\s+true", text):
            text += PERSISTENCE
        elif not re.search(r"(?m)^persistence_location", text):  # a conf.d snippet's
            text += f"\npersistence_location {self._tmp.name}/\n"
        text = text.replace("/var/lib/mosquitto/", self._tmp.name + "/")

        def new_port(match: re.Match[str]) -> str:
            self.ports.append(free_port())
            return f"listener {self.ports[-1]} 127.0.0.1"

        text = re.sub(r"(?m)^listener[ \t]+\d+([ \t]+\S+)?", new_port, text)
        if os.geteuid() == 0:
            # Started as root, Mosquitto would drop to user "mosquitto", which cannot read
            # files in our private temporary folders. Deployments install them for that user.
            text = "user root\n" + text
        conf = Path(self._tmp.name) / "mosquitto.conf"
        conf.write_text(text)
        self._group.start(
            "mosquitto", [self.binary, "-c", str(conf)], log_path=Path(self._tmp.name) / "log"
        )
        if not all(wait_for_port(p) for p in self.ports):
            log = (Path(self._tmp.name) / "log").read_text(errors="replace")
            self.stop()
            raise RuntimeError(f"mosquitto did not start:\n{log}")
        return self

    def kill(self, graceful: bool = False) -> None:
        """SIGKILL the broker (a crash), or SIGTERM it (``systemctl restart``), for fault tests.

        A SIGTERM lets Mosquitto save its persistence database (sessions, queued messages);
        a crash keeps only what its last autosave wrote.
        """
        if graceful:
            self._group.stop("mosquitto")
        else:
            self._group.kill("mosquitto")

    def restart(self) -> None:
        """Start the same broker again on the same ports (after :meth:`kill` or stop)."""
        conf = Path(self._tmp.name) / "mosquitto.conf"
        self._group.start(
            "mosquitto", [self.binary, "-c", str(conf)], log_path=Path(self._tmp.name) / "log"
        )
        if not all(wait_for_port(p) for p in self.ports):
            raise RuntimeError("mosquitto did not restart")

    def stop(self) -> None:
        """Stop Mosquitto and remove its temporary files."""
        self._group.close()
        self._tmp.cleanup()
