"""The command line's help: every option of every command says what it does."""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from deploy.cli import app


def test_every_option_of_every_command_has_help() -> None:
    # Prepare
    root = typer.main.get_command(app)
    # Execute
    missing = [
        f"{name} {'/'.join(param.opts)}"
        for name, command in root.commands.items()  # type: ignore[attr-defined]
        for param in command.params
        if param.name != "help" and not getattr(param, "help", None)
    ]
    # Assert
    assert missing == []


def test_h_is_help_for_the_command_and_its_commands() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["-h"])
    infer = runner.invoke(app, ["infer", "-h"])
    assert top.exit_code == 0 and "infer" in top.output
    assert infer.exit_code == 0 and "--connect-timeout" in infer.output
