"""fedstream benchmarks (not tests), run by ``fedstream bench <scenario>``.

Each scenario module has ``run(quick: bool) -> bench.common.Result``; results go to
``bench/results/<scenario>.{json,md,png}``. ``bench/ingest.py`` is a script of its own
(``python bench/ingest.py``): it needs a broker rather than the in-process runner.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this package: keep torch out until a scenario runs
    from bench.common import Result

__all__ = ["SCENARIOS", "run_scenario"]

# name -> module; ``all`` runs them in this order.
SCENARIOS = {
    "hetero": "bench.hetero",
    "streams": "bench.streams",
    "noniid": "bench.noniid",
    "compression": "bench.compression",
    "scale": "bench.scale",
    "reliability": "bench.reliability",
}


def run_scenario(
    name: str, quick: bool, out_dir: Path, json_path: Path | None = None
) -> tuple[Result, list[Path]]:
    """Run one scenario and write its files; return the result and the paths written."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}")
    from bench.common import write_result

    module = importlib.import_module(SCENARIOS[name])
    result: Result = module.run(quick=quick)
    return result, write_result(result, out_dir, json_path)
