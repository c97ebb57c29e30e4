"""Patched copies of impl functions: one deliberate bug, without touching the real impl.

`patch_source(function, edits)` recompiles the function's source with each `(old, new)` edit
applied to its code with the comments removed (so rewording a comment never breaks a patch; an
edit naming a comment fails, as one that matches nothing does). Each `old` must occur exactly
once, so a patch that no longer fits the code fails loudly instead of silently testing the
unchanged code. A numba kernel's copy is its plain
Python function: impl's kernels give identical results in both modes.

`swap(root, target, replacement)` copies `root` so that, directly or through the impl functions
it calls, it calls `replacement` wherever it called `target`; everything else stays shared.
The real impl modules are never modified: the copies live in their own namespaces.

    RequestScheduler.execute_decode_round -> execute_round -> lower_round
    swap(execute_decode_round, lower_round, patched)
        == execute_decode_round' -> execute_round' -> patched
"""

from __future__ import annotations

import inspect
import io
import textwrap
import tokenize
import types
from collections.abc import Callable
from typing import Any

Function = Callable[..., Any]


def python_function(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function behind a numba kernel (the function itself when it is not one)."""
    plain: Callable[..., Any] = getattr(kernel, "py_func", kernel)
    return plain


def _plain(function: Function) -> types.FunctionType:
    plain = python_function(function)
    if not isinstance(plain, types.FunctionType):
        raise TypeError(f"{function!r} is not a Python function or a numba kernel")
    return plain


def _copy(function: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    copy = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__annotations__ = dict(function.__annotations__)
    copy.__doc__ = function.__doc__
    copy.__qualname__ = function.__qualname__
    return copy


def without_comments(source: str) -> str:
    """`source` with every comment removed (and the spaces before it): only its code."""
    lines = source.splitlines(keepends=True)
    comments = [
        token.start
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for row, column in reversed(comments):
        line = lines[row - 1]
        lines[row - 1] = line[:column].rstrip() + ("\n" if line.endswith("\n") else "")
    return "".join(lines)


def patch_source(function: Function, edits: tuple[tuple[str, str], ...], label: str) -> types.FunctionType:
    """`function` recompiled with every `(old, new)` edit applied to its code (comments removed),
    in its module's namespace."""
    plain = _plain(function)
    lines = without_comments(textwrap.dedent(inspect.getsource(plain))).splitlines(keepends=True)
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)  # the decorator: a patched kernel runs as plain Python
    source = "".join(lines)  # dedented: a method body is indented 4 spaces, not 8
    for old, new in edits:
        found = source.count(old)
        if found != 1:
            raise ValueError(f"mutant {label!r}: {old!r} occurs {found} times in {plain.__qualname__}, not once")
        source = source.replace(old, new)
    namespace = dict(plain.__globals__)
    exec(compile(source, f"<mutant {label}: {plain.__qualname__}>", "exec"), namespace)
    patched = namespace[plain.__name__]
    assert isinstance(patched, types.FunctionType)
    patched.__qualname__ = plain.__qualname__
    return patched


def _calls(function: types.FunctionType) -> set[str]:
    names = set(function.__code__.co_names)
    for constant in function.__code__.co_consts:  # nested functions and lambdas share the globals
        if isinstance(constant, types.CodeType):
            names |= set(constant.co_names)
    return names


def swap(root: Function, target: Function, replacement: Function) -> types.FunctionType:
    """A copy of `root` that calls `replacement` wherever it (transitively) called `target`."""
    memo: dict[int, types.FunctionType | None] = {}
    goal = _plain(target)

    def visit(function: Function) -> types.FunctionType | None:
        plain = _plain(function)
        if id(plain) in memo:
            return memo[id(plain)]
        memo[id(plain)] = None  # recursion guard: a cycle does not reach the target through itself
        overrides: dict[str, Any] = {}
        for name in _calls(plain):
            value = plain.__globals__.get(name)
            if value is None or value is replacement:
                continue
            if getattr(value, "py_func", value) is goal:
                overrides[name] = replacement
            elif _is_impl_function(value):
                copied = visit(value)
                if copied is not None:
                    overrides[name] = copied
        result = _copy(plain, {**plain.__globals__, **overrides}) if overrides else None
        memo[id(plain)] = result
        return result

    copied = visit(root)
    if copied is None:
        raise ValueError(f"{_plain(root).__qualname__} never calls {_plain(target).__qualname__}")
    return copied


def _is_impl_function(value: object) -> bool:
    plain = getattr(value, "py_func", value)
    return isinstance(plain, types.FunctionType) and plain.__module__.startswith("kvsched.impl")
