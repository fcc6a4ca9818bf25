"""The ``fedstream`` command line as a package: each command in its audience's module, the
broker's options made into one ``BrokerOptions``, bounds checked by typer, imports kept lazy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

from deploy.cli import app
from deploy.cli.options import broker_options
from edge_client.runtime.mqtt import BrokerOptions, BrokerURL, make_client

WIDE = {"COLUMNS": "2000"}

LAYOUT = {
    "deploy.cli.device": {"ingest", "infer", "agent", "status", "publish"},
    "deploy.cli.operator": {
        "fleet", "sensors", "serve", "stop", "resume", "models", "report", "app", "run-config",
    },
    "deploy.cli.developer": {"demo", "simulate", "bench", "broker"},
}  # fmt: skip


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=WIDE)
    return result.exit_code, " ".join(result.output.split())


def test_every_command_lives_in_its_audiences_module_in_the_help_order() -> None:
    # Prepare
    root = typer.main.get_command(app)
    assert isinstance(root, click.Group)
    # Execute
    found: dict[str, set[str]] = {}
    for name, command in root.commands.items():
        assert command.callback is not None
        found.setdefault(command.callback.__module__, set()).add(name)
    # Assert: the package's layout, and the order `fedstream --help` always listed
    assert found == LAYOUT
    assert list(root.commands) == [
        "broker", "publish", "ingest", "status", "fleet", "sensors", "infer", "agent", "models",
        "stop",
        "report", "app", "run-config", "demo", "simulate", "resume", "serve", "bench",
    ]  # fmt: skip


def test_importing_the_cli_loads_no_heavy_library() -> None:
    code = (
        "import sys, deploy.cli; deploy.cli.app; "
        "print(sorted(m for m in ('torch', 'flwr', 'numpy', 'paho') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_broker_options_become_one_broker_options_that_hides_its_password() -> None:
    # Prepare: the credential options are declared once, for every MQTT command
    root = typer.main.get_command(app)
    assert isinstance(root, click.Group)
    for name in ("publish", "ingest", "infer", "fleet"):
        opts = {p.name for p in root.commands[name].params}
        assert {"username", "password", "cafile", "certfile", "keyfile", "broker"} <= opts
        assert "mqtt_version" in opts
    # Execute
    credentials: dict[str, str | None] = {
        "username": "dev-a",
        "password": "s3cret",
        "cafile": "ca.pem",
    }
    options = broker_options("mqtts://h", credentials, 3.0)
    # Assert
    assert isinstance(options, BrokerURL) and options.url == BrokerURL("h", 8883, True)
    assert (options.username, options.cafile, options.connect_timeout) == ("dev-a", "ca.pem", 3.0)
    assert str(options) == "mqtts://h:8883" and "s3cret" not in repr(options)
    assert BrokerOptions.of(BrokerURL("h", 1883)).uses_tls is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keyfile": "k.pem"}, "--keyfile needs --certfile"),
        ({"connect_timeout": 0.0}, "connect timeout must be > 0"),
    ],
)
def test_broker_options_are_checked_once(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerOptions.of("mqtt://h", **kwargs)  # type: ignore[arg-type]


def test_a_client_gets_the_credentials_and_tls_of_its_broker_options(tmp_path: Path) -> None:
    # Prepare: a CA file that cannot be used
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate")
    # Execute / Assert: the TLS files are the options' (a plain URL connects without)
    with pytest.raises(ValueError, match="TLS files"):
        make_client("c", BrokerOptions.of("mqtt://h", cafile=str(bad_ca)))
    client = make_client("c", BrokerOptions.of("mqtt://h", username="u", password="p"))
    assert client.username == "u" and client.password == "p"
    assert make_client("c", BrokerURL("h", 1883)).username is None


@pytest.mark.parametrize(
    "command",
    [
        ["publish", "--device-id", "d", "--rate", "1", "--count", "1"],
        ["ingest", "--device-id", "d", "--buffer", "b.sqlite"],
        ["infer", "--device-id", "d", "--model", "."],
        ["fleet"],
    ],
)
def test_every_mqtt_command_takes_the_same_broker_options(command: list[str]) -> None:
    # Execute: a key without its certificate, refused before anything connects
    code, output = invoke(*command, "--broker", "mqtt://127.0.0.1:1", "--keyfile", "k.pem")
    # Assert
    assert code == 2 and "--keyfile needs --certfile" in output


@pytest.mark.parametrize(
    "args",
    [
        ["ingest", "--device-id", "d", "--buffer", "b.sqlite", "--metrics-port", "0"],
        ["ingest", "--device-id", "d", "--buffer", "b.sqlite", "--commit-interval", "61"],
        ["infer", "--device-id", "d", "--model", ".", "--connect-timeout", "0"],
        ["publish", "--device-id", "d", "--rate", "1", "--qos", "3"],
        ["fleet", "--prometheus-port", "70000"],
        ["demo", "--devices", "0"],
        ["broker", "--port", "0"],
    ],
)
def test_typer_checks_the_bounds_of_options(args: list[str]) -> None:
    code, output = invoke(*args)
    assert code == 2 and "is not in the range" in output


def test_operator_commands_stop_and_report_answer_in_one_line(tmp_path: Path) -> None:
    # Execute
    stop_code, stop_out = invoke("stop", str(tmp_path))
    report_code, report_out = invoke("report", str(tmp_path))
    # Assert
    assert stop_code == 0 and "stops after its current round" in stop_out
    assert report_code != 0 and ("no metrics.jsonl" in report_out or "pip install" in report_out)
