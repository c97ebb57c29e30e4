"""numba's CPU entry points, typed for mypy.

numba ships a `py.typed` marker, but its decorators and type objects are unannotated, so under
`mypy --strict` every jitted function would be "untyped". Going through these thin wrappers keeps
the kernels' own annotations checked while numba's objects stay opaque (`Any`). numba.cuda has
the same wrappers in `kvsched.kernels.device`, kept apart because importing numba.cuda fixes,
for the whole process, whether kernels run on a GPU or in the simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Decorator = Callable[[Callable[..., Any]], Any]

_numba: Any = importlib.import_module("numba")
_extending: Any = importlib.import_module("numba.extending")

prange: Any = _numba.prange
types: Any = _numba.types
llvm_ir: Any = importlib.import_module("llvmlite.ir")
llvm_binding: Any = importlib.import_module("llvmlite.binding")


def njit(**options: Any) -> Decorator:
    """`numba.njit(**options)`."""
    decorator: Decorator = _numba.njit(**options)
    return decorator


def parallel_chunksize(size: int) -> Any:
    """`numba.parallel_chunksize(size)`: a context manager; prange loops entered inside it hand
    their iterations to the threads `size` at a time as each thread frees up."""
    return _numba.parallel_chunksize(size)


def intrinsic(function: Callable[..., Any]) -> Any:
    """`numba.extending.intrinsic`: `function(typingctx, *types)` returns (signature, codegen)."""
    return _extending.intrinsic(function)


def overload(target: Callable[..., Any], **options: Any) -> Decorator:
    """`numba.extending.overload(target, **options)`."""
    decorator: Decorator = _extending.overload(target, **options)
    return decorator
