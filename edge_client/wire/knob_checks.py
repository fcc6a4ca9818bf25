"""How a run-config key is declared and checked: :func:`knob`, and the checks of its type,
bounds and choices that every settings group runs on its own keys.

The keys themselves are declared by group in :mod:`edge_client.wire.settings_groups` and
composed into the whole run's settings in :mod:`edge_client.wire.run_config`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, field, fields
from typing import Any

from edge_client.wire.mapping import kebab

__all__ = [
    "GROUP",
    "MAX_AXES",
    "MAX_INT",
    "allowed",
    "check_knobs",
    "check_value",
    "group",
    "group_class",
    "knob",
    "knob_fields",
    "number_list",
    "parse_shape",
]

MAX_INT = 10**7  # no count in a run config (rounds, steps, batch, samples) is anywhere near
MAX_AXES = 4  # a sample: a vector, a window (channels, steps), an image, a clip

_GROUP = "group"
#: The metadata of a field that holds a whole settings group (its keys are the run's keys,
#: in its place): ``field(default_factory=Group, metadata=GROUP)``.
GROUP: Mapping[str, Any] = {_GROUP: True}


def group(cls: type) -> Any:
    """Declare a field of the run's settings that holds the settings group ``cls`` (at its
    defaults unless given): its keys are the run's keys, in its place."""
    return field(default_factory=cls, metadata=GROUP)


def knob(
    default: Any,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """Declare one run-config key: its default, a line of help, and what values it takes.

    Parameters
    ----------
    default : int, float, bool or str
        The default (its type is the key's type).
    help : str
        What the key does, for ``fedstream run-config`` and the docs.
    ge, gt, le, lt : float, optional
        Bounds: >=, >, <=, <.
    choices : tuple of str, optional
        The allowed values of a string key.
    """
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    return field(
        default=default,
        metadata={
            "help": help,
            "choices": choices,
            **{k: v for k, v in bounds.items() if v is not None},
        },
    )


def group_class(f: Field[Any]) -> type | None:
    """The settings group a field holds (declared ``field(default_factory=Group,
    metadata=GROUP)``), or None for a plain key."""
    if not f.metadata.get(_GROUP):
        return None
    cls: type = f.default_factory  # type: ignore[assignment]
    return cls


def knob_fields(settings: Any) -> Iterator[Field[Any]]:
    """Every key's field of a settings class (or instance), in declaration order, each
    group's keys in the group's place."""
    for f in fields(settings):
        cls = group_class(f)
        if cls is not None:
            yield from knob_fields(cls)
        elif "help" in f.metadata:
            yield f


def check_knobs(settings: Any, declared: type | None = None) -> None:
    """Check the types, bounds and choices of the keys declared by ``declared`` (the class
    of ``settings`` by default; groups it holds check themselves).

    Raises
    ------
    ValueError
        On the first value out of its key's bounds or choices; the message names the key.
    """
    for f in fields(declared or settings):
        if "help" in f.metadata:
            check_value(kebab(f.name), getattr(settings, f.name), f.metadata)


def check_value(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    """Check ``value`` against what is declared of run-config key ``key`` (``meta``).

    Raises
    ------
    ValueError
        If it is not finite, out of range, or outside the bounds or choices.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ValueError(f"{key} is out of range: {value}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ValueError(f"{key} must be one of {choices}, got {value!r}")
    if any(b in meta and not _BOUNDS[b][0](value, meta[b]) for b in _BOUNDS):
        raise ValueError(f"{key} must be {_span(meta)}, got {value}")


def allowed(meta: Mapping[str, Any]) -> str:
    """What a key takes, as text: its choices, its bounds, or '' when any value of its
    type goes."""
    if meta.get("choices"):
        return " | ".join(meta["choices"])
    if any(b in meta for b in _BOUNDS):
        return _span(meta)
    return ""


def parse_shape(text: str, key: str = "shape") -> tuple[int, ...]:
    """A sample shape written ``"6,32"`` (or ``"6x32"``).

    Raises
    ------
    ValueError
        If it is not one to four whole numbers >= 1; the message names ``key``.
    """
    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{key} must be comma-separated whole numbers, got {text!r}") from None
    if not 1 <= len(shape) <= MAX_AXES or min(shape) < 1 or math.prod(shape) > MAX_INT:
        raise ValueError(f"{key} needs 1 to {MAX_AXES} sizes >= 1, got {text!r}")
    return shape


def number_list(text: str, key: str, minimum: float) -> list[float]:
    """Parse a comma-separated run-config list such as ``sim-rates = "200,100"``.

    Raises
    ------
    ValueError
        If it is empty, not numbers, or a value is below ``minimum``.
    """
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{key} must be comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v >= minimum for v in values):
        raise ValueError(f"{key} needs values >= {minimum}, got {text!r}")
    return values


# bound -> (test, sign, bracket)
_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str, str]] = {
    "ge": (operator.ge, ">=", "["),
    "gt": (operator.gt, ">", "("),
    "le": (operator.le, "<=", "]"),
    "lt": (operator.lt, "<", ")"),
}


def _span(meta: Mapping[str, Any]) -> str:
    """``in [0, 1)`` for a range, ``> 0`` for one bound."""
    low = next((b for b in ("ge", "gt") if b in meta), None)
    high = next((b for b in ("le", "lt") if b in meta), None)
    if low and high:
        return f"in {_BOUNDS[low][2]}{meta[low]:g}, {meta[high]:g}{_BOUNDS[high][2]}"
    bound = low or high
    return f"{_BOUNDS[bound][1]} {meta[bound]:g}" if bound else "valid"
