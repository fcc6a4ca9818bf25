"""Flower's console log without colour codes where ``NO_COLOR`` is set (https://no-color.org).

Flower's console handler colours each line's level with ANSI codes and has no switch for it,
so a service's log (journald, a file) fills with escape sequences. The processes that log
are Flower's own programs (``flower-superlink``, ``flower-supernode``, SuperExec, the app
processes), started by name, not fedstream's. ``deploy/install.sh`` therefore writes a
``.pth`` file into the venv that imports this module at each start of the venv's interpreter
when ``NO_COLOR`` is set (the units set it): it waits for Flower's logger module to load and
then turns its colours off, the switch Flower has for it (``update_console_handler``).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["PTH_FILE", "PTH_LINE", "install"]

#: Flower's module that makes the console handler.
LOGGER_MODULE = "flwr.supercore.logger"
#: The file ``install.sh`` writes into the venv's site-packages, and its one line (Python
#: runs a ``.pth`` line that starts with ``import``; this one imports nothing without
#: ``NO_COLOR``).
PTH_FILE = "fedstream-plain-logs.pth"
PTH_LINE = 'import os; os.environ.get("NO_COLOR") and __import__("deploy.plain_logs").plain_logs'


def _plain(module: ModuleType) -> None:
    module.update_console_handler(colored=False)


class _PlainOnLoad(importlib.abc.MetaPathFinder):
    """Finds Flower's logger module with the other finders and turns its colours off once
    it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != LOGGER_MODULE:
            return None
        sys.meta_path.remove(self)  # once is enough
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _plain_after(spec.loader.exec_module)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _plain_after(run: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """``run`` (a loader's ``exec_module``), then colours off in the module it ran."""

    def exec_module(module: ModuleType) -> None:
        run(module)
        _plain(module)

    return exec_module


def install() -> None:
    """Turn Flower's console colours off in this process: now if its logger is loaded, else
    when it loads."""
    if LOGGER_MODULE in sys.modules:
        _plain(sys.modules[LOGGER_MODULE])
    elif not any(isinstance(f, _PlainOnLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _PlainOnLoad())


if os.environ.get("NO_COLOR"):
    install()
