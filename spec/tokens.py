"""Reading a prompt's token ids from what an engine has at hand, in native work per token.

A prompt may come as a tuple or list of ints, as a `array.array` of an integer type, as any
one-dimensional buffer of integers (a numpy array: the buffer protocol, no numpy import), or as
bytes of little-endian u32s. Every token must be an unsigned 32-bit integer; anything else is
one `InvalidArgument` naming the first bad token or the bad form. The checks and the packing
run in C (`array`, `memoryview`); a Python loop runs only for a sequence whose items are not all
plain ints (numpy scalars, say), one `require_u32` each, as before.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from operator import countOf
from typing import cast

from kvsched.spec.domain import require_u32
from kvsched.spec.errors import InvalidArgument

_INTEGER_FORMATS = frozenset("bBhHiIlLqQnN")  # struct's native integer formats (a buffer's item format)
_U32 = "I" if array("I").itemsize == 4 else "L"  # the array type code of a 4-byte unsigned int
_LITTLE = sys.byteorder == "little"


def read_tokens(prompt: object) -> tuple[tuple[int, ...], bytes]:
    """The prompt's token ids, and the same as little-endian u32 bytes; `InvalidArgument` for an
    empty prompt, a form it is not, or a token outside 0..2**32-1."""
    plain = False  # a tuple of plain ints, which is kept as it is
    if isinstance(prompt, bytes | bytearray):
        packed = _from_bytes(bytes(prompt))
    elif isinstance(prompt, tuple | list):
        packed, plain = _from_ints(prompt)
        plain = plain and type(prompt) is tuple
    elif (view := _buffer(prompt)) is not None:
        packed = _from_buffer(view)
    else:
        raise InvalidArgument(
            "prompt must be a non-empty tuple, list, integer array or buffer, or little-endian u32 bytes,"
            f" not {type(prompt).__name__}"
        )
    if not packed:
        raise InvalidArgument("prompt must hold at least one token")
    data = packed.tobytes() if _LITTLE else _swapped(packed)
    return (cast(tuple[int, ...], prompt) if plain else tuple(packed)), data  # plain: a tuple of ints, read


def _from_bytes(data: bytes) -> array[int]:
    if len(data) % 4:
        raise InvalidArgument(f"prompt bytes must be little-endian u32s: {len(data)} bytes is not a multiple of 4")
    packed = array(_U32)
    packed.frombytes(data)
    if not _LITTLE:
        packed.byteswap()
    return packed


def _from_ints(tokens: Sequence[object]) -> tuple[array[int], bool]:
    """The tokens packed, and whether each was a plain int (not a bool, not a numpy scalar)."""
    if countOf(map(type, tokens), int) == len(tokens):  # plain ints: array checks each one's range in C
        try:
            return array(_U32, tokens), True  # type: ignore[arg-type]  # plain ints, checked just above
        except OverflowError:
            pass  # the loop below names the first token out of range
    return array(_U32, [require_u32("prompt token", token) for token in tokens]), False


def _from_buffer(view: memoryview) -> array[int]:
    item = view.format.lstrip("@")
    if view.ndim != 1 or item not in _INTEGER_FORMATS:
        raise InvalidArgument(
            f"a prompt buffer must be one-dimensional integers in native byte order, not {view.ndim}-D"
            f" of format {view.format!r}"
        )
    if view.itemsize == 4 and item in ("I", "L") and view.c_contiguous:
        packed: array[int] = array(_U32)
        packed.frombytes(view.cast("B"))  # unsigned 32-bit already: every value is a token id
        return packed
    return _from_ints(view.tolist())[0]


def _buffer(value: object) -> memoryview | None:
    """A view of `value` when it has the buffer protocol (an array, a numpy array), else None."""
    try:
        return memoryview(value)  # type: ignore[arg-type]  # probing the buffer protocol
    except TypeError:
        return None


def _swapped(packed: array[int]) -> bytes:
    swapped = array(packed.typecode, packed)
    swapped.byteswap()
    return swapped.tobytes()
