"""The one place impl/ touches numba: a typed `jit` decorator.

numba ships no type stubs, so `numba.njit` is an untyped decorator under `mypy --strict`; `jit`
keeps each kernel's Python signature visible to mypy. Kernels are compiled lazily on first call
and cached on disk (`cache=True`). With `NUMBA_DISABLE_JIT=1` every kernel runs as the plain
Python function it is written as (CrossHair and debuggers use that mode); the kernels are written
so that both modes give identical results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])


def jit(function: F) -> F:
    """Compile `function` with numba in nopython mode, keeping its declared signature."""
    return cast(F, numba.njit(cache=True, nogil=True)(function))
