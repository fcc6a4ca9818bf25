"""The command line's help: every option and argument of every command says what it does, and
the help page shows it."""

from __future__ import annotations

import click
import typer.main
from typer.testing import CliRunner

from deploy.cli import app

WIDE = {"COLUMNS": "2000"}  # no wrapping: each help text on one line of the page


def test_every_option_of_every_command_has_help() -> None:
    # Prepare: each parameter's help as declared (click's Option.help; typer's, and from
    # click 8.5 click's, Argument.help), and each command's help page as a user sees it
    root = typer.main.get_command(app)
    assert isinstance(root, click.Group)
    runner = CliRunner()
    missing, unshown = [], []
    for name, command in root.commands.items():
        page = " ".join(runner.invoke(app, [name, "--help"], env=WIDE).output.split())
        for param in command.params:
            # Execute
            text = getattr(param, "help", None)
            label = f"{name} {'/'.join(param.opts)}"
            if param.name == "help":
                continue
            if not text:
                missing.append(label)
            elif " ".join(text.split()[:3]) not in page:
                unshown.append(label)
    # Assert
    assert missing == []
    assert unshown == []


def test_h_is_help_for_the_command_and_its_commands() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["-h"])
    infer = runner.invoke(app, ["infer", "-h"])
    assert top.exit_code == 0 and "infer" in top.output
    assert infer.exit_code == 0 and "--connect-timeout" in infer.output
