"""Options that several commands share, and the choices of options.

The broker's options (``--broker``, ``--username``, ``--password``, ``--cafile``,
``--certfile``, ``--keyfile``, ``--mqtt-version``, ``--connect-timeout``) are declared here
once; a command hands what it was given to :func:`broker_options`, which makes one
:class:`~edge_client.runtime.mqtt.BrokerOptions` of them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer

from deploy.constants import DEFAULT_BROKER_URL
from edge_client.emulation.constants import DISTRIBUTIONS
from edge_client.runtime.constants import (
    DEFAULT_MAX_GAP_S,
    DEFAULT_MAX_SKEW_S,
    DEFAULT_POLICY,
    MQTT_VERSION_ENV,
    MQTT_VERSIONS,
    POLICIES,
)
from edge_client.wire.constants import RATE_SETS
from edge_client.wire.mapping import kebab
from edge_client.wire.run_config import default

if TYPE_CHECKING:
    from edge_client.runtime.mqtt import BrokerOptions

__all__ = [
    "DEFAULT_BROKER_URL",
    "DISTRIBUTION_DEFAULT",
    "NO_CREDENTIALS",
    "NO_READINGS",
    "POLICY_DEFAULT",
    "PORT",
    "POSITIVE",
    "READINGS_PANEL",
    "BrokerOption",
    "ConnectTimeoutOption",
    "ConnectionOption",
    "Credentials",
    "DaemonConnectTimeoutOption",
    "Distribution",
    "FieldsOption",
    "MaxGapOption",
    "MaxPayloadOption",
    "MaxSkewOption",
    "MetricsListenOption",
    "MetricsPortOption",
    "Policy",
    "RateOption",
    "RateSet",
    "Readings",
    "RuntimeApiOption",
    "StrideOption",
    "SuperExecSecretOption",
    "TimeFieldOption",
    "TimeUnitOption",
    "TopicOption",
    "VerboseOption",
    "WindowOption",
    "broker_options",
    "reading_option",
    "run_help",
    "with_credentials",
    "with_readings",
]

# Choices of options, from the vocabularies declared in the constants modules.
Policy = StrEnum("Policy", [(p, p) for p in POLICIES])  # type: ignore[misc]
Distribution = StrEnum("Distribution", [(d, d) for d in DISTRIBUTIONS])  # type: ignore[misc]
RateSet = Enum("RateSet", {name: name for name in RATE_SETS}, type=str)  # type: ignore[misc]
POLICY_DEFAULT = Policy(DEFAULT_POLICY)
DISTRIBUTION_DEFAULT = Distribution(DISTRIBUTIONS[0])
READINGS_PANEL = "Per-reading JSON (--window)"

# Bounds typer checks (and shows in the help).
POSITIVE = click.FloatRange(0, min_open=True)
PORT = click.IntRange(1, 65535)

VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")]

# The broker: where it is and how to connect (one BrokerOptions, see broker_options).
BrokerOption = Annotated[str, typer.Option(help="mqtt://HOST:PORT or mqtts://...")]
UsernameOption = Annotated[
    str | None, typer.Option(help="Broker username (the device id under the ACL).")
]
PasswordOption = Annotated[
    str | None,
    typer.Option(
        envvar="FEDSTREAM_MQTT_PASSWORD", help="Broker password (better: the environment variable)."
    ),
]
CafileOption = Annotated[str | None, typer.Option(help="CA bundle (enables TLS).")]
CertfileOption = Annotated[
    str | None,
    typer.Option(
        help="This client's certificate (PEM; enables TLS), for brokers that require one "
        "(Mosquitto's require_certificate, AWS IoT)."
    ),
]
KeyfileOption = Annotated[
    str | None, typer.Option(help="The key of --certfile (PEM), if not in the same file.")
]
MqttVersionOption = Annotated[
    str | None,
    typer.Option(
        "--mqtt-version",
        envvar=MQTT_VERSION_ENV,
        help="MQTT version: 5 (default; bursts wait in flight, not in the broker's queue) or "
        "3.1.1 for brokers without MQTT 5 (the embedded one).",
        click_type=click.Choice(MQTT_VERSIONS),
        show_default=False,
    ),
]
MaxPayloadOption = Annotated[
    int,
    typer.Option(
        "--max-payload",
        help="Largest message to publish, in bytes; bigger ones go as several (AWS IoT "
        "Core takes 128 KB, Azure IoT Hub 256 KB).",
        min=1024,
    ),
]
ConnectionOption = Annotated[
    str | None,
    typer.Option(help="SuperLink connection in $FLWR_HOME/config.toml (default: its default)."),
]
# The device daemons' (ingest, infer): they retry for ever unless given one.
#: How long a one-shot command (``fleet``, ``sensors``) waits for the broker.
ConnectTimeoutOption = Annotated[
    float,
    typer.Option(
        "--connect-timeout", help="Exit 1 (with the reason) if not connected by then.", min=0.1
    ),
]
DaemonConnectTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--connect-timeout",
        help="Exit 1 (with the reason) if the first connection has not succeeded after "
        "this many seconds; default: keep retrying.",
        click_type=POSITIVE,
    ),
]


def _grouped(placeholder: str, options: dict[str, tuple[Any, Any]]) -> Decorator:
    """A decorator that gives a command the ``options`` (name -> (typer annotation, default))
    in place of its parameter ``placeholder``, which receives them as one dict.

    Declared once, the options stand where ``placeholder`` stands in each command's
    parameters (and so in its help page); typer reads the command's ``__signature__``.
    """

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != placeholder:
                params.append(param)
                continue
            params += [
                inspect.Parameter(name, param.kind, default=value, annotation=option)
                for name, (option, value) in options.items()
            ]

        @functools.wraps(command)
        def run(**kwargs: Any) -> None:
            group = {name: kwargs.pop(name) for name in options}
            command(**kwargs, **{placeholder: group})

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return run

    return decorate


Decorator = Callable[[Callable[..., None]], Callable[..., None]]

#: What :data:`with_credentials` hands a command: its credential options by name.
Credentials = dict[str, str | None]
NO_CREDENTIALS: Credentials = {}
#: The broker's credential, TLS and protocol options (``--username``, ``--password``,
#: ``--cafile``, ``--certfile``, ``--keyfile``, ``--mqtt-version``) in place of a command's
#: parameter ``credentials``.
with_credentials = _grouped(
    "credentials",
    {
        "username": (UsernameOption, None),
        "password": (PasswordOption, None),
        "cafile": (CafileOption, None),
        "certfile": (CertfileOption, None),
        "keyfile": (KeyfileOption, None),
        "mqtt_version": (MqttVersionOption, None),
    },
)


def broker_options(
    broker: str, credentials: Credentials, connect_timeout: float | None = None
) -> BrokerOptions:
    """The broker options a command was given, as one
    :class:`~edge_client.runtime.mqtt.BrokerOptions`.

    Raises
    ------
    ValueError
        If the URL is invalid or a key comes without its certificate.
    """
    from edge_client.runtime.mqtt import BrokerOptions  # paho: only once a command runs

    return BrokerOptions.of(broker, connect_timeout=connect_timeout, **credentials)


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve Prometheus metrics on this port (/metrics); default: off.",
        click_type=PORT,
    ),
]
MetricsListenOption = Annotated[
    str, typer.Option("--metrics-listen", help="Address the metrics endpoint binds to.")
]


def reading_option(text: str, *flags: str, **bounds: Any) -> Any:
    """An option of per-reading JSON (``ingest`` and ``infer``), in its panel of the help."""
    return typer.Option(*flags, help=text, rich_help_panel=READINGS_PANEL, **bounds)


TopicOption = Annotated[
    list[str] | None,
    reading_option(
        "Subscribe to this topic instead of fedstream/v1/<id>/samples (repeatable; "
        "wildcards allowed). With --window: TOPIC=FIELDS names that topic's channels.",
        "--topic",
    ),
]
FieldsOption = Annotated[
    str | None,
    reading_option("Per-reading JSON: the channels' fields, e.g. ax,ay,az, imu.acc.x or acc[0:3]."),
]
WindowOption = Annotated[
    int | None, reading_option("Readings per sample (turns on per-reading JSON).", min=1)
]
StrideOption = Annotated[
    int | None, reading_option("Readings between sample starts (default: the window).")
]
MaxGapOption = Annotated[
    float, reading_option("No sample spans a longer gap between readings (s).", "--max-gap")
]
RateOption = Annotated[
    float | None, reading_option("Resample onto this many readings/s (needed with several topics).")
]
MaxSkewOption = Annotated[
    float, reading_option("How far one topic may run behind another (s).", "--max-skew")
]
TimeFieldOption = Annotated[
    str,
    reading_option(
        "The timestamp's field; none: readings have none, each is stamped when it arrives.",
        "--time-field",
    ),
]
TimeUnitOption = Annotated[
    str, reading_option("s, ms, us or ns (ISO 8601 strings are read too).", "--time-unit")
]
PayloadOption = Annotated[
    str,
    reading_option(
        "json (per-reading JSON), plain (one bare number a message, as ESPHome and Home "
        "Assistant's statestream publish: with a + in --topic, the level naming the channel; "
        "needs --time-field none) or sparkplug (Sparkplug B: --topic spBv1.0/GROUP/DDATA/"
        "NODE/DEVICE, --fields the metrics' names; births, deaths and sequence gaps followed).",
        "--payload",
    ),
]
ReportOnChangeOption = Annotated[
    bool,
    reading_option(
        "Sensors that publish only when a value changes: hold each channel's last value on "
        "the --rate grid, up to --max-gap, instead of interpolating (a channel that has never "
        "reported holds the samples back).",
        "--report-on-change",
    ),
]
SparkplugRebirthOption = Annotated[
    bool,
    reading_option(
        "Sparkplug B: when data comes with aliases no birth has named (the daemon started "
        "after the edge node's birth), ask the edge node for its births (an NCMD "
        "Node Control/Rebirth; at most every 30 s). Off by default: it writes to someone "
        "else's equipment; until then such data is held (and counted).",
        "--sparkplug-rebirth",
    ),
]
TimeZoneOption = Annotated[
    str | None,
    reading_option(
        "The IANA time zone of ISO 8601 timestamps that name none (Tasmota's local time), "
        "e.g. Europe/Berlin; default: UTC.",
        "--time-zone",
    ),
]


def run_help(name: str, text: str) -> str:
    """Help of a demo option that is a run-config key: what it does, its key and default."""
    return f"{text} ({kebab(name)}, default {default(name)})"


#: What :data:`with_readings` hands a command: its per-reading JSON options by name.
Readings = dict[str, Any]
NO_READINGS: Readings = {}
#: The per-reading options (``--topic``, ``--fields``, ``--window``, ``--stride``,
#: ``--max-gap``, ``--rate``, ``--max-skew``, ``--time-field``, ``--time-unit``,
#: ``--payload``, ``--time-zone``, ``--report-on-change``, ``--sparkplug-rebirth``) of
#: ``ingest`` and ``infer``, in place of a command's parameter ``readings``.
with_readings = _grouped(
    "readings",
    {
        "topic": (TopicOption, None),
        "fields": (FieldsOption, None),
        "window": (WindowOption, None),
        "stride": (StrideOption, None),
        "max_gap": (MaxGapOption, DEFAULT_MAX_GAP_S),
        "rate": (RateOption, None),
        "max_skew": (MaxSkewOption, DEFAULT_MAX_SKEW_S),
        "time_field": (TimeFieldOption, "ts"),
        "time_unit": (TimeUnitOption, "s"),
        "payload": (PayloadOption, "json"),
        "time_zone": (TimeZoneOption, None),
        "report_on_change": (ReportOnChangeOption, False),
        "sparkplug_rebirth": (SparkplugRebirthOption, False),
    },
)

#: Taking a SuperNode's tasks (``fedstream agent``, ``fedstream infer``'s agent).
RuntimeApiOption = Annotated[
    str | None,
    typer.Option(
        "--runtime-api",
        help="Take the tasks of the SuperNode whose runtime API listens here "
        "(host:port; the SuperNode runs with --isolation process): no process per message.",
    ),
]
SuperExecSecretOption = Annotated[
    Path | None,
    typer.Option(
        "--superexec-auth-secret-file",
        help="The SuperNode's --superexec-auth-secret-file (mode 0600): only a process "
        "that reads it may take the device's tasks. The tasks being served are noted beside "
        "it (<file>.task-<id>), for a restarted agent to answer at once.",
    ),
]
