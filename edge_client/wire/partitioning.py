"""How a recording is split across devices: the schemes the run config (``sim-partition``)
and the commands (``--partition``) name. The split itself is the emulation's
(:mod:`edge_client.emulation.partitions`, through Flower Datasets' partitioners)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SCHEMES", "Scheme", "parse_scheme", "scheme_of"]

#: The schemes and what their argument is.
SCHEMES = {"natural": None, "iid": None, "dirichlet": "ALPHA > 0", "pathological": "K >= 1"}
_SCHEME = re.compile(r"^\s*([a-z]+)\s*(?:\(\s*([^)]*)\s*\))?\s*$")


@dataclass(frozen=True)
class Scheme:
    """How to split: ``kind`` (one of :data:`SCHEMES`) and its argument (alpha, or K)."""

    kind: str
    value: float | None = None

    def __str__(self) -> str:
        if self.value is None:
            return self.kind
        return f"{self.kind}({self.value:g})"


def parse_scheme(text: str) -> Scheme:
    """Read ``natural``, ``iid``, ``dirichlet(0.3)`` or ``pathological(2)``.

    Raises
    ------
    ValueError
        Naming the schemes, if ``text`` is none of them or its argument is out of range.
    """
    match = _SCHEME.match(text)
    known = ", ".join(k if a is None else f"{k}({a.split()[0]})" for k, a in SCHEMES.items())
    if match is None or match.group(1) not in SCHEMES:
        raise ValueError(f"partition {text!r} is none of: {known}")
    kind, arg = match.group(1), match.group(2)
    if SCHEMES[kind] is None:
        if arg:
            raise ValueError(f"partition {kind} takes no argument, got {text!r}")
        return Scheme(kind)
    try:
        value = float(arg or "")
    except ValueError:
        raise ValueError(
            f"partition {kind} needs {SCHEMES[kind]}: {kind}(...), got {text!r}"
        ) from None
    if kind == "dirichlet" and not value > 0:
        raise ValueError(f"dirichlet's alpha must be > 0, got {value:g}")
    if kind == "pathological" and (value < 1 or value != int(value)):
        raise ValueError(f"pathological takes a whole number of classes >= 1, got {value:g}")
    return Scheme(kind, value)


def scheme_of(partition: str, partition_by: str) -> Scheme:
    """The scheme a run config's ``sim-partition`` and ``sim-partition-by`` name (empty
    ``partition``: ``natural`` with a key, else ``iid``).

    Raises
    ------
    ValueError
        If the scheme is unknown, ``natural`` comes without a key, or a key with another
        scheme.
    """
    scheme = parse_scheme(partition or ("natural" if partition_by else "iid"))
    if scheme.kind == "natural" and not partition_by:
        raise ValueError("a natural partition needs the key its groups are in (partition-by)")
    if partition_by and scheme.kind != "natural":
        raise ValueError(
            f"partition-by {partition_by!r} goes with a natural partition, not {scheme}"
        )
    return scheme
