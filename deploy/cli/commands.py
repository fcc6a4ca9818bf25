"""The ``fedstream`` command: one typer app with every command of the package registered on it,
in the order ``fedstream --help`` lists them."""

from __future__ import annotations

from typing import Annotated

import typer

from deploy.cli import developer, device, operator

__all__ = ["app", "main"]

app = typer.Typer(
    name="fedstream",
    help="Federated learning on live MQTT sensor streams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"fedstream {version('fedstream')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Federated learning on live MQTT sensor streams."""


app.command()(developer.broker)
app.command()(device.publish)
app.command()(device.ingest)
app.command()(device.status)
app.command()(operator.fleet)
app.command()(operator.sensors)
app.command()(device.infer)
app.command()(device.agent)
app.command()(operator.models)
app.command()(operator.stop)
app.command()(operator.report)
app.command("app")(operator.write_app_dir)
app.command("run-config")(operator.run_config_keys)
app.command()(developer.demo)
app.command()(developer.simulate)
app.command()(operator.resume)
app.command()(operator.serve)
app.command()(developer.bench)


def main() -> None:
    """Entry point of the ``fedstream`` console script."""
    app()
