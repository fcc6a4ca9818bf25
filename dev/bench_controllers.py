"""Re-run only the controller comparison of ``fedstream bench deployment`` (about 25 minutes
against 50 for the whole scenario) and put it in place of the committed one:

    python dev/bench_controllers.py [bench/results]

The other runs of ``deployment.json`` are kept as they are; ``deployment.md`` is rewritten
from the merged entries. For when only the controller (or its benchmark setting) changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from deploy.bench.common import write_result
from deploy.bench.deployment import rerun_controllers


def main(out: Path) -> None:
    """Re-run the controllers and rewrite ``out``'s deployment results."""
    doc = json.loads((out / "deployment.json").read_text())
    for path in write_result(rerun_controllers(doc), out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results"))
