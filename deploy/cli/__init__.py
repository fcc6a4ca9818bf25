"""The ``fedstream`` command line, one module per audience.

- :mod:`~deploy.cli.commands`: the typer ``app`` with every command registered, and ``main``
  (the ``fedstream`` console script, ``python -m deploy``);
- :mod:`~deploy.cli.device`: what runs on a device: ``ingest``, ``infer``, ``status``,
  ``publish``;
- :mod:`~deploy.cli.operator`: what an operator runs: ``fleet``, ``serve``, ``stop``,
  ``resume``, ``models``, ``report``, ``app``, ``run-config``;
- :mod:`~deploy.cli.developer`: what a developer runs: ``demo``, ``bench``, ``broker``;
- :mod:`~deploy.cli.options`: the options several commands share (the broker's among them);
- :mod:`~deploy.cli.common`: what every command does (logging, one-line failures, signals).

Each command imports what it runs inside its body, so that ``fedstream ingest`` on a small
device never loads torch or Flower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_client.lazy import lazy_exports

if TYPE_CHECKING:
    from deploy.cli.commands import app, main

_EXPORTS = {"app": "commands", "main": "commands"}
__all__ = ["app", "main"]
__getattr__ = lazy_exports(__name__, _EXPORTS)
