"""What the optional parts of an install bring, and the clear error when one is missing.

A device installs only what it runs (``pip install fedstream``): the ingest daemon,
``publish``, ``infer``, ``status``, ``fleet`` and the SuperNode's ClientApp. The demo's
pieces, the embedded broker (iotcore: no 32-bit ARM wheel) and the plots (matplotlib), are
the ``demo`` extra, which the benchmarks use too.
"""

from __future__ import annotations

import importlib.util

__all__ = ["DEMO_EXTRA", "MissingExtraError", "require_extra"]

#: The ``demo`` extra: import name -> what it is for.
DEMO_EXTRA = {"iotcore": "the embedded MQTT broker", "matplotlib": "plots"}


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
        what = ", ".join(f"{m} ({DEMO_EXTRA.get(m, m)})" for m in missing)
        raise MissingExtraError(
            f"{purpose} needs {what}: pip install 'fedstream[demo]' "
            "(the embedded broker has no 32-bit ARM wheel: use Mosquitto there)"
        )
