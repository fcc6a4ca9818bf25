"""One mapping between Python fields and fedstream's kebab-case keys, for every record.

What crosses a boundary (the run config, the round plan, a device's reply, a round of
``metrics.jsonl``, the aggregator's checkpoint) is a dataclass, and its keys are its field
names with dashes, as Flower's keys are: ``batch_size`` travels as ``batch-size``. This
module is the only place that turns one into the other, so no key is spelled twice.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar, cast

__all__ = ["MappingError", "convert_fields", "from_mapping", "kebab", "to_mapping"]

T = TypeVar("T")


class MappingError(ValueError):
    """A mapping that does not fit its record: a missing, unknown or ill-typed key.

    Attributes
    ----------
    key : str
        The kebab-case key at fault (the first of them for unknown keys).
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key


def kebab(name: str) -> str:
    """The key of a field: ``batch_size`` -> ``batch-size``."""
    return name.replace("_", "-")


def to_mapping(record: Any, *, skip_none: bool = True) -> dict[str, Any]:
    """A dataclass as a dict with kebab-case keys (nested records, dicts and lists too).

    Parameters
    ----------
    record : dataclass instance
        The record.
    skip_none : bool
        Leave out fields that are None (optional values not known).
    """
    out: dict[str, Any] = {}
    for key, name, _, _ in _fields(cast(Any, type(record))):
        value = getattr(record, name)
        if value is None and skip_none:
            continue
        out[key] = value if type(value) in _SCALARS else _dump(value, skip_none)
    return out


_SCALARS = frozenset({int, float, str, bool, bytes})


def _dump(value: Any, skip_none: bool) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_mapping(value, skip_none=skip_none)
    if isinstance(value, Mapping):
        return {str(k): _dump(v, skip_none) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_dump(v, skip_none) for v in value)
    if isinstance(value, (list, tuple)):
        return [_dump(v, skip_none) for v in value]
    return value


def from_mapping(cls: type[T], mapping: Mapping[str, Any], *, strict: bool = False) -> T:
    """Build the dataclass ``cls`` from a mapping with kebab-case keys.

    Values are converted to the fields' annotated types (``int``, ``float``, ``bool``,
    ``str``, ``bytes``, ``X | None``, ``dict[str, X]``, ``list[X]``, nested records); a
    field the mapping lacks takes its default.

    Parameters
    ----------
    cls : type
        A dataclass.
    mapping : Mapping
        The keys and values.
    strict : bool
        Refuse keys that are not fields (a typo in a run config); otherwise they are
        ignored (a newer peer's additions).

    Raises
    ------
    MappingError
        On a missing required key, an unknown key (``strict``) or a value that does not
        convert. Checks of the record itself (``__post_init__``) raise what they raise.
    """
    if strict:
        known = {key for key, _, _, _ in _fields(cast(Any, cls))}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise MappingError(unknown[0], f"unknown keys {unknown}; known: {sorted(known)}")
    return cls(**convert_fields(cls, mapping))


def convert_fields(cls: type, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``mapping`` for the fields of dataclass ``cls``, by field name and
    converted to the fields' types (as :func:`from_mapping` does, without building the
    record; keys that are not fields are left out).

    Raises
    ------
    MappingError
        On a missing required key or a value that does not convert.
    """
    values: dict[str, Any] = {}
    for key, name, convert, required in _fields(cast(Any, cls)):
        if key not in mapping:
            if required:
                raise MappingError(key, f"lacks {key!r}")
            continue
        value = mapping[key]
        try:
            values[name] = convert(value)
        except (TypeError, ValueError, OverflowError) as err:
            raise MappingError(key, f"{key}={value!r}: {err}") from err
    return values


Converter = Callable[[Any], Any]


@cache
def _fields(cls: Any) -> tuple[tuple[str, str, Converter, bool], ...]:
    """(key, field name, converter, required) of each field of a dataclass, worked out once
    from its annotations."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            kebab(f.name),
            f.name,
            _converter(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
        if f.init
    )


def _converter(hint: Any) -> Converter:
    """A function that turns a mapping's value into a value of type ``hint``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        convert = _converter(inner)
        return lambda v: None if v is None else convert(v)
    if hint is Any:
        return lambda v: v
    if hint is bool:
        return _to_bool
    if hint is float:
        return _to_float
    if hint in (int, str):
        return cast(Converter, hint)
    if hint is bytes:
        return _to_bytes
    if origin in (dict, Mapping):
        item = _converter(args[1])
        return lambda v: {str(k): item(x) for k, x in _expect(v, Mapping).items()}
    if origin in (list, set):
        item = _converter(args[0])
        if origin is set:
            return lambda v: {item(x) for x in _expect(v, (list, tuple, set, frozenset))}
        return lambda v: [item(x) for x in _expect(v, (list, tuple, set, frozenset))]
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        record = hint
        return lambda v: from_mapping(record, _expect(v, Mapping))
    raise TypeError(f"no conversion to {hint!r}")


def _to_float(value: Any) -> float:
    """A float; JSON's ``null`` (how a record writes NaN: JSON has none) reads as NaN."""
    return math.nan if value is None else float(value)


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)


def _to_bytes(value: Any) -> bytes:
    return bytes(_expect(value, (bytes, bytearray)))


def _expect(value: Any, kinds: type | tuple[type, ...]) -> Any:
    """``value`` if it is one of ``kinds``, else a TypeError that names them."""
    if not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise TypeError(f"expected {names}, got {type(value).__name__}")
    return value
