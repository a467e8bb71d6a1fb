"""Section dataclasses built from JSON data, every value checked against its type hint.

A record is a tree of keyword-only dataclasses (its sections) whose fields hold JSON values
(numbers, strings, booleans, None, lists, objects with string keys) or further sections.
`section(cls, data)` builds a `cls` from such data field by field, following the type hints:
a nested section is built in turn, lists and objects item by item, and an int where a float
is hinted becomes a float (a bool is never a number). A field that is missing, unknown or of
the wrong type raises `RecordError` naming where the data came from, the field's dotted path
and the offending value; an unknown field also names the schema version this reader knows.

Each section's fields and each type hint are compiled once into checking functions
(value, where, path) -> value: a history of tens of thousands of records, each ~200 values,
reads in seconds, with the same checks and messages as a walk of the hints.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from reports.record.errors import RecordError
from reports.record.versions import SCHEMA

__all__ = ["RecordError", "record_section", "section"]


def record_section(cls):
    """Makes `cls` a section: a keyword-only dataclass (every section class is one)."""
    return dataclasses.dataclass(kw_only=True)(cls)


def section(cls, data: Any, where: str = "record"):
    """One validated section (e.g. `Environment`) from JSON data of the current schema."""
    return _build(cls, data, where, "")


_SECTIONS: dict[type, tuple[frozenset[str], list[tuple[str, bool, Any]]]] = {}
_CHECKERS: dict[Any, Any] = {}


def _fields(cls) -> tuple[frozenset[str], list[tuple[str, bool, Any]]]:
    """A section's field names, and per field (name, required, checker)."""
    if cls not in _SECTIONS:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        _SECTIONS[cls] = (frozenset(f.name for f in fields),
                          [(f.name, _required(f), _checker(hints[f.name])) for f in fields])
    return _SECTIONS[cls]


def _required(field: dataclasses.Field) -> bool:
    """A field without a default (neither a value nor a factory) must be in the data."""
    return (field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING)


def _build(cls, data: Any, where: str, path: str):
    if not isinstance(data, dict):
        raise RecordError(f"{where}: field {path or cls.__name__!r}: expected an object, got "
                          f"{type(data).__name__}")
    names, fields = _fields(cls)
    if not data.keys() <= names:
        unknown = sorted(set(data) - names)
        raise RecordError(f"{where}: unknown field {_join(path, unknown[0])!r} (schema {SCHEMA})")
    values = {}
    for name, required, check in fields:
        if name not in data:
            if required:
                raise RecordError(f"{where}: missing field {_join(path, name)!r}")
            continue
        values[name] = check(data[name], where, _join(path, name))
    return cls(**values)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


_NUMBERS = {int: (int,), float: (int, float)}


def _fail(hint, value, where: str, path: str):
    raise RecordError(f"{where}: field {path!r}: expected {getattr(hint, '__name__', hint)}, "
                      f"got {type(value).__name__} {value!r:.40}")


def _checker(hint):
    """The checking function of type `hint` (compiled once): None where `hint` allows it,
    a nested section built, lists and dicts item by item (a list of numbers at once), a
    number or string of the hinted type (an int where a float is hinted becomes a float;
    a bool is no number); anything else raises RecordError naming where, the field and the
    value."""
    if hint in _CHECKERS:
        return _CHECKERS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        (inner,) = [a for a in args if a is not type(None)]
        item = _checker(inner)

        def check(value, where, path):
            if value is None and nullable:
                return None
            return item(value, where, path)
    elif dataclasses.is_dataclass(hint):
        def check(value, where, path):
            return _build(hint, value, where, path)
    elif origin is list:
        item, numbers = _checker(args[0]), args[0] is float

        def check(value, where, path):
            if not isinstance(value, list | tuple):  # a tuple in memory, a list in JSON
                _fail(hint, value, where, path)
            if numbers and all(type(v) is float or type(v) is int for v in value):
                return [float(v) for v in value]  # the samples: every one checked at once
            return [item(v, where, f"{path}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        item = _checker(args[1])

        def check(value, where, path):
            if not isinstance(value, dict):
                _fail(hint, value, where, path)
            return {k: item(v, where, f"{path}.{k}") for k, v in value.items()}
    elif hint is Any:
        def check(value, where, path):
            return value
    else:
        expected = _NUMBERS.get(hint, (hint,)) if isinstance(hint, type) else ()

        def check(value, where, path):
            if expected and isinstance(value, expected) and not (
                    isinstance(value, bool) and hint is not bool):
                return float(value) if hint is float else value
            _fail(hint, value, where, path)
    _CHECKERS[hint] = check
    return check
