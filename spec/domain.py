"""Value domains of the ABI: what an id, a token or a count may be.

The integer rule, one for spec and impl: an integer argument (a request id, a page, a logical
page, a token, a count, a size) is any value `operator.index` accepts except a boolean: an
`int`, a subclass of it (an `IntEnum` member), a numpy integer (an id read back from a
scheduler's own arrays). Every operation uses the plain `int` it denotes, so what a call
stores and returns is always an `int`. Anything else (a bool, a float, a string, `None`) is
refused with `InvalidArgument` (`InvalidConfig` for a constructor size) before anything
changes.
"""

from __future__ import annotations

import operator

from kvsched.spec.batch import U32_MAX, U64_MAX
from kvsched.spec.errors import InvalidArgument, InvalidConfig


def as_int(value: object) -> int | None:
    """The plain int an integer argument denotes, or None when `value` is not one."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # refuses what has no __index__
    except Exception:  # an __index__ that raises is not an integer either
        return None


def require_int(name: str, value: object) -> int:
    """`value` as a plain int, or `InvalidArgument`."""
    number = as_int(value)
    if number is None:
        raise InvalidArgument(f"{name} must be an integer, got {type(value).__name__}")
    return number


def require_u64(name: str, value: object) -> int:
    """`value` as an unsigned 64-bit integer, or `InvalidArgument`."""
    number = require_int(name, value)
    if not 0 <= number <= U64_MAX:
        raise InvalidArgument(f"{name} {number} is outside 0..2**64-1")
    return number


def require_u32(name: str, value: object) -> int:
    """`value` as an unsigned 32-bit integer, or `InvalidArgument`."""
    number = require_int(name, value)
    if not 0 <= number <= U32_MAX:
        raise InvalidArgument(f"{name} {number} is outside 0..2**32-1")
    return number


def require_size(name: str, value: object, low: int, high: int) -> int:
    """A constructor size within `low..high`, or `InvalidConfig`."""
    number = as_int(value)
    if number is None:
        raise InvalidConfig(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= number <= high:
        raise InvalidConfig(f"{name} {number} is outside {low}..{high}")
    return number
