"""What the optional parts of an install bring, and the clear error when one is missing.

A device installs only what it runs (``pip install fedstream``): the ingest daemon,
``publish``, ``infer``, ``status``, ``fleet`` and the SuperNode's ClientApp. The demo's
pieces, the embedded broker (iotcore: no 32-bit ARM wheel), the plots (matplotlib) and Flower
Datasets' partitioners (a recording split across devices), are the ``demo`` extra, which the
benchmarks use too; Flower's simulation engine (Ray) is the ``simulation`` extra.
"""

from __future__ import annotations

import importlib.util

__all__ = ["DEMO_EXTRA", "EXTRAS", "MissingExtraError", "require_extra"]

#: The ``demo`` extra: import name -> what it is for.
DEMO_EXTRA = {"iotcore": "the embedded MQTT broker", "matplotlib": "plots"}
#: Every optional module: import name -> (what it is for, the extra that brings it).
EXTRAS = {
    **{module: (what, "demo") for module, what in DEMO_EXTRA.items()},
    "flwr_datasets": ("partitions of a recording", "demo"),
    "ray": ("Flower's simulation engine", "simulation"),
}


class MissingExtraError(RuntimeError):
    """A part of fedstream needs an extra that is not installed (the message says which)."""


def require_extra(purpose: str, modules: tuple[str, ...] = tuple(DEMO_EXTRA)) -> None:
    """Check that ``modules`` can be imported before ``purpose`` starts.

    Raises
    ------
    MissingExtraError
        Naming what is missing and the command that installs it.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        what = ", ".join(f"{m} ({EXTRAS.get(m, (m, 'demo'))[0]})" for m in missing)
        extras = ",".join(sorted({EXTRAS.get(m, (m, "demo"))[1] for m in missing}))
        hint = (
            " (the embedded broker has no 32-bit ARM wheel: use Mosquitto there)"
            if "iotcore" in missing
            else ""
        )
        raise MissingExtraError(f"{purpose} needs {what}: pip install 'fedstream[{extras}]'{hint}")
