"""The code's shape, walked over the source: no import circles, no oversized file or function.

- **No circles**: no module imports (at module level or inside a function) a module that
  imports it back, directly or through others; and no two packages do so through any of
  their modules (``edge_client.task`` -> ``edge_client.wire`` -> ``edge_client.task``). A
  package's ``if TYPE_CHECKING:`` block is left out: it never runs, and the packages'
  lazy exports name their own modules there. A module loading its own parent packages is
  not a circle (Python always does).
- **Sizes**: no module of package code over :data:`MAX_FILE_LINES` lines; no function whose
  body (from its first statement to its last, the signature left out: a typer command's
  options are its signature) is over :data:`MAX_FUNCTION_LINES`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache

import pytest

from tests.source_walk import PACKAGES, ROOT, imported, modules

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def _runs(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` but those of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for orelse in child.orelse for n in [orelse, *_runs(orelse)])
            continue
        yield child
        yield from _runs(child)


@cache
def imports(module: str) -> frozenset[str]:
    """Project modules ``module`` imports when it runs (with the packages on their way),
    leaving out its own parent packages."""
    parts = module.split(".")
    parents = {".".join(parts[:i]) for i in range(1, len(parts))}
    out = imported(_runs(ast.parse(modules()[module].read_text())))
    return frozenset(out - parents - {module})


def package_of(module: str) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return module if modules()[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def package_imports() -> dict[str, set[str]]:
    """Package -> the packages its modules import, leaving out its ancestors and its own
    sub-packages (a package holds those)."""
    out: dict[str, set[str]] = {}
    for module in modules():
        a = package_of(module)
        for target in imports(module):
            b = package_of(target)
            if a != b and not b.startswith(f"{a}.") and not a.startswith(f"{b}."):
                out.setdefault(a, set()).add(b)
    return out


def circles(graph: Mapping[str, frozenset[str] | set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_circle_finder_finds_circles() -> None:
    # Prepare: a -> b -> c -> a, and d -> a (not in the circle)
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    # Execute / Assert
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_walk_sees_function_level_imports_and_skips_type_checking_blocks() -> None:
    # Prepare / Execute: the runtime package names its modules only for type checkers;
    # the ServerApp module's run function imports at function level.
    runtime = imports("edge_client.runtime")
    # Assert
    assert "edge_client.runtime.buffer" not in runtime
    assert "edge_client.wire.records" in imports("edge_client.runtime.client_app")


def test_no_module_imports_itself_back() -> None:
    assert circles({m: imports(m) for m in modules()}) == []


def test_no_two_packages_import_each_other() -> None:
    assert circles(package_imports()) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_the_size_limit(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    end = node.end_lineno or node.lineno
    return end - node.body[0].lineno + 1


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_body_is_over_the_size_limit(package: str) -> None:
    long = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": n
        for path in (ROOT / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := _body_lines(node)) > MAX_FUNCTION_LINES
    }
    assert long == {}
