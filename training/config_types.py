"""The one type check of a run config's values, shared by every section.

A value must have its default's type, with the same rules wherever it is read (the
client's run config, a request's sections on the coordinator and the nodes, an
algorithm's own keys): a boolean is never a number nor a number a boolean, an integer is
taken where a number is expected (as a float), a list holds items of its default's first
item's type, a mapping has string keys, and a default of None takes any value. The
message names the key as its caller labels it and says what the value must be, in words
(`type_name`). Ranges and choices stay with each section. This module imports nothing of
the trainer, so every section can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_FLOAT_INT = 2**1023  # larger ints do not fit a float

_NAMES = {bool: "a boolean (true or false)", int: "an integer", float: "a number",
          str: "a string", dict: "a mapping"}


def shown(value: int) -> str:
    """An integer for a one-line message: a huge one abbreviated to its digit count."""
    digits = len(str(abs(value))) if abs(value) < 10**4000 else None
    if digits is not None and digits <= 24:
        return str(value)
    return f"an integer of {digits or 'over 4000'} digits"


def type_name(default: Any) -> str:
    """What a value of ``default``'s type is, in words: "an integer", "a list of numbers"."""
    if isinstance(default, list):
        return f"a list of {type_name(default[0]).split(' ', 1)[1]}s" if default else "a list"
    return _NAMES.get(type(default), f"a {type(default).__name__}")


def checked_value(label: str, value: Any, default: Any,
                  error: type[ValueError] = ValueError) -> Any:
    """``value`` if it has ``default``'s type (an int made a float where a float is
    expected, a mapping a dict, a list a copy); else ``error`` naming ``label``, e.g.
    "config key 'epochs' must be an integer, got 'many'"."""
    if not _has_type(value, default):
        raise error(f"{label} must be {type_name(default)}, got {value!r}")
    if isinstance(default, float) and not isinstance(value, float):
        if abs(value) > MAX_FLOAT_INT:  # float() would overflow
            raise error(f"{label} is out of range, got {shown(value)}")
        return float(value)
    if isinstance(default, (list, dict)):
        return type(default)(value)
    return value


def _has_type(value: Any, default: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and (
            not default or all(_has_type(item, default[0]) for item in value))
    if isinstance(default, dict):
        return isinstance(value, Mapping) and all(isinstance(key, str) for key in value)
    return isinstance(value, type(default))
