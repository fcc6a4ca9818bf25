"""A ``sim-population`` as the run config gives it, checked: which distributions, presets and
trace file draw the simulation engine's virtual devices (the draws themselves:
:mod:`edge_client.emulation.population`, whose documentation gives the syntax).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from edge_client.wire.constants import OMNILEARN_LEVELS, RATE_SETS

__all__ = ["PopulationSpec", "finite_number", "parse_population", "positive_number"]

_TERM = re.compile(r"^(slowdown|rate|availability|trace)=(.+)$")
_CALL = re.compile(r"^([a-z]+)\((.*)\)$")
_DISTS = {
    "slowdown": ("const", "uniform", "lognormal", "choice", "omnilearn"),
    "rate": ("const", "uniform", "normal", "choice", "scadles"),
    "availability": ("always", "churn"),
}
_ARITY = {"const": 1, "uniform": 2, "lognormal": 2, "normal": 2, "churn": 2}


@dataclass(frozen=True)
class PopulationSpec:
    """A parsed ``sim-population``.

    Attributes
    ----------
    slowdown, rate : tuple of (str, tuple of str) or None
        The distribution's name and arguments (None: ``sim-slowdowns``, ``sim-rates``).
    churn : tuple of (float, float) or None
        Mean online and offline spells, seconds (None: always online).
    trace : str
        The trace file (empty: none).
    """

    slowdown: tuple[str, tuple[str, ...]] | None = None
    rate: tuple[str, tuple[str, ...]] | None = None
    churn: tuple[float, float] | None = None
    trace: str = ""


def parse_population(spec: str) -> PopulationSpec:
    """Read a ``sim-population`` (syntax: :mod:`edge_client.emulation.population`).

    Raises
    ------
    ValueError
        If a term, a distribution or a number is not one it knows (the message says which,
        and what it takes).
    """
    slowdown = rate = None
    churn = None
    trace = ""
    for term in spec.split():
        match = _TERM.match(term)
        if match is None:
            raise ValueError(
                f"sim-population term {term!r}: expected slowdown=, rate=, availability= or trace="
            )
        key, value = match.groups()
        if key == "trace":
            if Path(value).suffix != ".csv":
                raise ValueError(f"sim-population trace {value!r}: a .csv file is expected")
            trace = value
            continue
        name, args = _call(key, value)
        if key == "slowdown":
            slowdown = (name, args)
        elif key == "rate":
            rate = (name, args)
        elif name == "churn":
            on, off = (positive_number(a, f"sim-population {term}") for a in args)
            churn = (on, off)
    return PopulationSpec(slowdown, rate, churn, trace)


def _call(key: str, value: str) -> tuple[str, tuple[str, ...]]:
    """``name(args)`` of a term, checked: the distribution and its arguments."""
    if value == "always" and key == "availability":
        return "always", ()
    match = _CALL.match(value)
    names = _DISTS[key]
    if match is None or match.group(1) not in names:
        raise ValueError(f"sim-population {key}={value!r}: expected one of {', '.join(names)}")
    name, raw = match.groups()
    args = tuple(a.strip() for a in raw.split(",")) if raw.strip() else ()
    if name == "omnilearn":
        if args not in tuple((level,) for level in OMNILEARN_LEVELS):
            raise ValueError(f"{key}=omnilearn(...): one of {', '.join(OMNILEARN_LEVELS)}")
        return name, args
    if name == "scadles":
        if len(args) != 1 or args[0] not in RATE_SETS:
            raise ValueError(f"{key}=scadles(...): one of {', '.join(RATE_SETS)}")
        return name, args
    need = _ARITY.get(name)
    if (need is not None and len(args) != need) or (name == "choice" and not args):
        raise ValueError(f"{key}={value!r}: {name} takes {need or 'one or more'} numbers")
    for a in args:
        finite_number(a, f"{key}={value}")
    if name == "uniform" and float(args[0]) > float(args[1]):
        raise ValueError(f"{key}={value!r}: uniform(A,B) needs A <= B")
    if name in ("lognormal", "normal") and float(args[1]) < 0:
        raise ValueError(f"{key}={value!r}: the spread must be >= 0")
    return name, args


def finite_number(text: str, what: str) -> float:
    """``text`` as a finite number; a ValueError naming ``what`` otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: {text!r} is not a finite number")
    return value


def positive_number(text: str, what: str) -> float:
    """``text`` as a number > 0; a ValueError naming ``what`` otherwise."""
    value = finite_number(text, what)
    if value <= 0:
        raise ValueError(f"{what}: {text!r} must be > 0")
    return value
