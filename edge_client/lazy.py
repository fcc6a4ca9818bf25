"""Package exports loaded on first use (PEP 562).

A package's ``__init__`` lists its public names, but importing the package should not load
what a caller does not use: the ingest daemon must not load torch because the ClientApp,
in the same package, needs it. :func:`lazy_exports` gives the package a ``__getattr__``
that imports a name's module when the name is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``exports`` maps each public name to
    the module (relative to the package) that defines it."""

    def get(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return get
