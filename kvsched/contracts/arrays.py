"""impl's kernels as plain Python over plain lists, so CrossHair can execute them symbolically.

numpy makes CrossHair's symbolic values concrete and numba code cannot run symbolic values at
all. impl's kernels are written to give identical results as plain Python
(`kvsched.impl.jit`), so the contracts run each kernel's Python function (`pure`) on list-backed
stand-ins for its arrays:

    Row      a 1-D array: a list with `.shape`
    Grid     a 2-D array: `grid[row, column]`, `.shape == (rows, columns)`
    records  a structured array: a list of dicts, `records[i]["field"]`

`pure(kernel)` also rebinds every kernel the function calls to its Python function, so a call
tree of kernels runs uncompiled whether or not `NUMBA_DISABLE_JIT` is set.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any


class Row(list[int]):
    """A 1-D integer array."""

    @property
    def shape(self) -> tuple[int]:
        """(length,)"""
        return (len(self),)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice) and not isinstance(value, Iterable):
            value = [value] * len(range(*key.indices(len(self))))  # numpy's broadcast `a[:] = 0`
        super().__setitem__(key, value)


class Grid:
    """A 2-D integer array, indexed `grid[row, column]`."""

    def __init__(self, rows: Iterable[Iterable[int]]) -> None:
        self.rows = [list(row) for row in rows]

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns)"""
        return (len(self.rows), len(self.rows[0]) if self.rows else 0)

    def __getitem__(self, key: tuple[int, int]) -> int:
        return self.rows[key[0]][key[1]]

    def __setitem__(self, key: tuple[int, int], value: int) -> None:
        self.rows[key[0]][key[1]] = value

    def as_tuples(self) -> tuple[tuple[int, ...], ...]:
        """The rows as tuples (a comparable snapshot)."""
        return tuple(tuple(row) for row in self.rows)


def python_function(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function behind a numba kernel (the function itself when it is not one)."""
    plain: Callable[..., Any] = getattr(kernel, "py_func", kernel)
    return plain


def records(count: int, *fields: str) -> list[dict[str, int]]:
    """`count` zeroed records with these fields."""
    return [dict.fromkeys(fields, 0) for _ in range(count)]


def stack(free: Sequence[int], size: int) -> tuple[Row, Row]:
    """A free stack of `size` slots holding `free` (top last), and its `top` cell."""
    return Row([*free, *([0] * (size - len(free)))]), Row([len(free)])


def pure(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The kernel's Python function, with every kernel it calls rebound to its Python function."""
    function = python_function(kernel)
    namespace = dict(function.__globals__)
    for name in function.__code__.co_names:
        if hasattr(namespace.get(name), "py_func"):
            namespace[name] = pure(namespace[name])
    copy = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy
