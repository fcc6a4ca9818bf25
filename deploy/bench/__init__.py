"""fedstream benchmarks (not tests), run by ``fedstream bench <scenario>``.

Each scenario module has ``run(quick: bool) -> deploy.bench.common.Result``; results go to
``bench/results/<scenario>.{json,md,png}`` (``--out`` to change). ``deploy.bench.ingest`` is a
script of its own (``python -m deploy.bench.ingest``): it needs a broker rather than the
in-process runner.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this package: keep torch out until a scenario runs
    from deploy.bench.common import Result

__all__ = ["SCENARIOS", "run_scenario"]

# name -> module; ``all`` runs them in this order.
SCENARIOS = {
    "hetero": "deploy.bench.hetero",
    "defaults": "deploy.bench.defaults",
    "streams": "deploy.bench.streams",
    "noniid": "deploy.bench.noniid",
    "compression": "deploy.bench.compression",
    "scale": "deploy.bench.scale",
    "forecast": "deploy.bench.forecast",
    "reliability": "deploy.bench.reliability",
    "async": "deploy.bench.asynchronous",
    "deployment": "deploy.bench.deployment",
    "idle": "deploy.bench.idle_fleet",
    "drift": "deploy.bench.drift_recovery",
    "inference": "deploy.bench.inference",
    "bursts": "deploy.bench.bursts",
    "service": "deploy.bench.continuous_run",
    "simulation": "deploy.bench.simulation",
    "people": "deploy.bench.people",
    "privacy": "deploy.bench.privacy",
    "secagg": "deploy.bench.secagg",
}


def run_scenario(
    name: str, quick: bool, out_dir: Path, json_path: Path | None = None
) -> tuple[Result, list[Path]]:
    """Run one scenario and write its files; return the result and the paths written."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}")
    from deploy.bench.common import write_result

    module = importlib.import_module(SCENARIOS[name])
    result: Result = module.run(quick=quick)
    return result, write_result(result, out_dir, json_path)
