"""Reading the project's own source as text: its modules and the project modules each
import statement names. The layer rules (tests/unit/test_layers.py) and the code-shape rules
(tests/unit/test_structure.py) walk the same graph."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

__all__ = ["PACKAGES", "ROOT", "imported", "modules"]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edge_client", "aggregator", "deploy")


@cache
def modules() -> dict[str, Path]:
    """Every project module by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(nodes: Iterable[ast.AST]) -> set[str]:
    """Project modules the import statements among ``nodes`` load: each named module with
    the packages on its way (``import a.b.c`` loads ``a``, ``a.b`` and ``a.b.c``)."""
    out: set[str] = set()
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            out.update(
                ".".join(parts[:i])
                for i in range(1, len(parts) + 1)
                if ".".join(parts[:i]) in modules()
            )
    return out
