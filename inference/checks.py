"""Type checks for values that arrive as JSON or as configuration, shared by every edge that validates them.

`bool` is a subclass of `int` in Python, so an integer check excludes it explicitly; a number that is not finite
(JSON's 1e400 parses as inf) is never a valid setting.
"""
from __future__ import annotations

import math


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a finite float (ints are always finite; testing them with math.isfinite overflows on huge ones)."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def json_type(value: object) -> str:
    """The JSON name of a value's type, for error messages a non-Python client understands."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)
