"""What every command does: log, fail in one line, stop on signals."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from deploy.extras import DEMO_EXTRA, MissingExtraError, require_extra
from deploy.local import Stopped, descendants, stop_on_signals

if TYPE_CHECKING:
    from edge_client.runtime.infer import InferenceDaemon
    from edge_client.runtime.ingest import IngestDaemon

__all__ = [
    "console",
    "fail",
    "parse_run_config",
    "parse_shape",
    "require",
    "run_daemon",
    "setup_logging",
    "stoppable",
]


console = Console(stderr=True)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise typer.BadParameter(f"shape must look like 6,32 or 6x32, got {text!r}") from None
    if not shape or min(shape) < 1:
        raise typer.BadParameter(f"shape dimensions must be >= 1, got {text!r}")
    return shape


def run_daemon(daemon: IngestDaemon | InferenceDaemon) -> None:
    """Run a device daemon until SIGTERM; a broker never reached is a runtime failure."""
    try:
        daemon.run()
    except (ConnectionError, OSError) as err:  # OSError: its metrics port is taken
        raise fail(str(err), code=1) from err


@contextlib.contextmanager
def stoppable(what: str, *, normal_end: bool = False) -> Iterator[None]:
    """Run a command that starts processes so that SIGTERM, Ctrl-C or SIGHUP stops all of
    them (a second one kills them at once), says so, and exits with the signal's code (0
    where a signal is how ``what`` normally ends: ``normal_end``)."""
    try:
        with stop_on_signals(lambda line: console.print(f"[yellow]{escape(line)}[/yellow]")):
            yield
    except Stopped as stop:
        left = descendants(os.getpid())
        if left:
            pids = ", ".join(str(pid) for pid, _ in left)
            console.print(f"[red]{what} stopped by {stop}; still running: {pids}[/red]")
        else:
            console.print(f"[yellow]{what} stopped by {stop}; nothing it started is running[/]")
        raise typer.Exit(0 if normal_end else stop.exit_code) from None


def require(purpose: str, modules: tuple[str, ...] = tuple(DEMO_EXTRA)) -> None:
    """Exit 1 with the install command if ``purpose`` needs an extra that is missing."""
    try:
        require_extra(purpose, modules)
    except MissingExtraError as err:
        raise fail(str(err), code=1) from err


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as one line and return the exit to raise: 2 for a usage error
    (bad options or input), 1 for a failure at run time (a broker never reached)."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # [...] is text
    return typer.Exit(code)


def parse_run_config(text: str | None) -> dict[str, object]:
    """``'key=value ...'`` as ``flwr run --run-config`` reads it (TOML values).

    Raises
    ------
    ValueError
        If it is not in that form.
    """
    if not text:
        return {}
    import click
    from flwr.common.config import parse_config_args

    try:
        return dict(parse_config_args([text]))
    except click.ClickException as err:
        raise ValueError(f"--run-config {text!r}: {err.message}") from err
