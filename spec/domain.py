"""Value domains of the ABI: what an id, a token or a count may be.

Every public operation checks its arguments against these domains first, so a bad value is
refused with `InvalidArgument` before anything changes.
"""

from __future__ import annotations

from kvsched.spec.batch import U32_MAX, U64_MAX
from kvsched.spec.errors import InvalidArgument, InvalidConfig


def is_int(value: object) -> bool:
    """A plain integer (booleans are not ids)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_u64(name: str, value: object) -> int:
    """`value` as an unsigned 64-bit integer, or `InvalidArgument`."""
    if not is_int(value):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    assert isinstance(value, int)
    if not 0 <= value <= U64_MAX:
        raise InvalidArgument(f"{name} {value} is outside 0..2**64-1")
    return value


def require_u32(name: str, value: object) -> int:
    """`value` as an unsigned 32-bit integer, or `InvalidArgument`."""
    if not is_int(value):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    assert isinstance(value, int)
    if not 0 <= value <= U32_MAX:
        raise InvalidArgument(f"{name} {value} is outside 0..2**32-1")
    return value


def require_size(name: str, value: object, low: int, high: int) -> int:
    """A constructor size within `low..high`, or `InvalidConfig`."""
    if not is_int(value):
        raise InvalidConfig(f"{name} must be an int, got {type(value).__name__}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise InvalidConfig(f"{name} {value} is outside {low}..{high}")
    return value
