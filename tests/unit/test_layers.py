"""The layers' import rules, walked over the source (every import, module-level or inside a
function, and the packages each import loads on the way).

- The aggregator uses only the wire and task layers of ``edge_client`` and its one module of
  Flower's internals (with the task wake it imports): never the device runtime (trainer,
  buffer, ingest daemon) or the stream emulation (replay, publisher).
- ``edge_client`` never imports the aggregator or the launchers.
- The wire and task layers, and Flower's internals, stand on their own: none reaches the
  runtime or the emulation.
- A device never loads the stream emulation: the runtime never imports it (the emulation
  builds on the runtime). The app Flower loads (``edge_client.flower_app``) provides the
  simulation engine's virtual devices to the runtime's hook, importing the emulation only
  at the first virtual node (a function-level import).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections import deque
from functools import cache

import pytest

from tests.source_walk import imported, modules


@cache
def imports(module: str, eager_only: bool) -> frozenset[str]:
    """Project modules ``module`` imports (with the packages on their way); only those
    at module level when ``eager_only``."""
    tree = ast.parse(modules()[module].read_text())
    out = imported(tree.body if eager_only else ast.walk(tree))
    out.discard(module)
    return frozenset(out)


def reach(start: str, eager_only: bool = False) -> dict[str, list[str]]:
    """Every project module ``start`` loads, with the chain of imports that gets there."""
    seen = {start: [start]}
    todo = deque([start])
    while todo:
        current = todo.popleft()
        for nxt in imports(current, eager_only):
            if nxt not in seen:
                seen[nxt] = [*seen[current], nxt]
                todo.append(nxt)
    return seen


def offending(sources: str, forbidden: tuple[str, ...], eager_only: bool = False) -> list[str]:
    """Chains from modules under ``sources`` to modules under ``forbidden``."""
    bad = []
    for module in modules():
        if module == sources or module.startswith(f"{sources}."):
            for target, chain in reach(module, eager_only).items():
                if target.startswith(forbidden):
                    bad.append(" -> ".join(chain))
    return sorted(bad)


def test_the_walk_sees_imports_inside_functions_and_the_packages_on_the_way() -> None:
    # The walk itself: the app's simulation branch is a function-level import.
    flower_app = "edge_client.flower_app"
    assert "edge_client.emulation.simulation" in imports(flower_app, eager_only=False)
    assert "edge_client.emulation.simulation" not in imports(flower_app, eager_only=True)
    assert {"edge_client", "edge_client.wire"} <= reach("edge_client.wire.records").keys()


def test_the_aggregator_uses_only_the_wire_and_task_layers() -> None:
    # An allowlist: a new edge_client package is outside it until someone says otherwise.
    allowed = ("edge_client.wire", "edge_client.task")
    # the container, its export helper, and Flower's internals (the ServerApp's reply pulls)
    bare = {
        "edge_client",
        "edge_client.lazy",
        "edge_client.flower_internals",
        "edge_client.task_wake",
    }
    bad = [
        " -> ".join(chain)
        for module in modules()
        if module.split(".")[0] == "aggregator"
        for target, chain in reach(module).items()
        if target.split(".")[0] in ("edge_client", "deploy")
        and target not in bare
        and not target.startswith(allowed)
    ]
    assert sorted(bad) == []


@pytest.mark.parametrize(
    ("sources", "forbidden"),
    [
        ("edge_client.wire", ("edge_client.runtime", "edge_client.emulation")),
        ("edge_client.task", ("edge_client.runtime", "edge_client.emulation")),
        ("edge_client.flower_internals", ("edge_client.runtime", "edge_client.emulation")),
        ("edge_client.task_wake", ("edge_client.runtime", "edge_client.emulation")),
    ],
)
def test_a_layer_never_imports_what_it_must_not(sources: str, forbidden: tuple[str, ...]) -> None:
    assert offending(sources, forbidden) == []


def test_a_device_never_loads_the_stream_emulation() -> None:
    assert offending("edge_client.runtime", ("edge_client.emulation",), eager_only=True) == []
    # nor inside a function: the emulation builds on the runtime, never the other way
    assert offending("edge_client.runtime", ("edge_client.emulation",)) == []
    # the app Flower loads provides the virtual devices without loading them on a device
    assert offending("edge_client.flower_app", ("edge_client.emulation",), eager_only=True) == []


PUBLIC = (
    "edge_client.wire",
    "edge_client.task",
    "edge_client.runtime",
    "edge_client.emulation",
    "aggregator",
    "deploy",
)


@pytest.mark.parametrize("package", PUBLIC)
def test_every_package_says_what_it_holds_and_exports_its_names(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__ and len(module.__doc__) > 100
    assert module.__all__ and all(getattr(module, name) is not None for name in module.__all__)


@pytest.mark.parametrize(
    ("imports", "must_not_load"),
    [
        # Importing packages loads nothing until a name is used.
        ("import edge_client.runtime, edge_client.wire, edge_client.task, aggregator", "torch"),
        # The ingest daemon (and `fedstream status`, `publish`) run on small devices: they
        # must not pay for torch or Flower, which the ClientApp in the same package needs.
        ("import edge_client.runtime.ingest, edge_client.emulation.publisher", "torch"),
        ("import edge_client.runtime.ingest, edge_client.emulation.publisher", "flwr"),
        # A real device's ClientApp, as Flower loads it: the emulation only at a virtual node
        ("import edge_client.flower_app", "edge_client.emulation"),
    ],
)
def test_importing_loads_only_what_is_used(imports: str, must_not_load: str) -> None:
    code = f"import sys; {imports}; print({must_not_load!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
