"""Patched copies of impl functions: one deliberate bug, without touching the real impl.

`patch_statements(function, edits)` recompiles a function (a numba kernel as its plain Python
function) with statements replaced or deleted, each addressed by its position in the function
(`Statement.path`) and the kind of statement expected there, never by its text: renaming a local
or rewording a line does not move an address, and an address whose statement changed kind fails
loudly. The impl mutant corpus breaks kernels this way; everything else it breaks through small
named methods a subclass overrides.

`patch_source(function, edits)` recompiles the function's source with each `(old, new)` edit
applied to its code with the comments removed (so rewording a comment never breaks a patch; an
edit naming a comment fails, as one that matches nothing does). Each `old` must occur exactly
once, so a patch that no longer fits the code fails loudly instead of silently testing the
unchanged code. A numba kernel's copy is its plain
Python function: impl's kernels give identical results in both modes.

`swap(root, target, replacement)` copies `root` so that, directly or through the impl functions
it calls, it calls `replacement` wherever it called `target`; everything else stays shared.
The real impl modules are never modified: the copies live in their own namespaces.

    RequestScheduler.execute_decode_round -> execute_round -> lower_decode -> lower_round
    swap(execute_decode_round, lower_round, patched)
        == execute_decode_round' -> execute_round' -> lower_decode' -> patched
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
import types
from collections.abc import Callable
from dataclasses import dataclass
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


def _compiled(plain: types.FunctionType, code: str | ast.Module, label: str) -> types.FunctionType:
    """`plain`'s edited definition, compiled in a copy of its module's namespace."""
    namespace = dict(plain.__globals__)
    exec(compile(code, f"<mutant {label}: {plain.__qualname__}>", "exec"), namespace)
    patched = namespace[plain.__name__]
    assert isinstance(patched, types.FunctionType)
    patched.__qualname__ = plain.__qualname__
    return patched


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
    return _compiled(plain, source, label)


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement edit: `path` indexes the function's body (its docstring is statement 0), each
    later index the body of the statement before; `kind` is the statement's AST type there;
    `source` replaces it (one or more statements; None deletes it)."""

    path: tuple[int, ...]
    kind: type[ast.stmt]
    source: str | None = None


def _locate(body: list[ast.stmt], path: tuple[int, ...], label: str) -> tuple[list[ast.stmt], ast.stmt]:
    node: ast.stmt | None = None
    for depth, index in enumerate(path):
        if depth:
            inner = getattr(node, "body", None)
            if not isinstance(inner, list):
                raise ValueError(f"mutant {label!r}: statement {path[:depth]} has no body")
            body = inner
        if not 0 <= index < len(body):
            raise ValueError(f"mutant {label!r}: no statement at {path[: depth + 1]}")
        node = body[index]
    assert node is not None
    return body, node


def patch_statements(function: Function, edits: tuple[Statement, ...], label: str) -> types.FunctionType:
    """`function` recompiled with each statement edit applied, in its module's namespace."""
    plain = _plain(function)
    tree = ast.parse(textwrap.dedent(inspect.getsource(plain)))
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    definition.decorator_list = []  # a patched kernel runs as plain Python
    located = []
    for edit in edits:  # every address is read on the unedited function
        body, node = _locate(definition.body, edit.path, label)
        if not isinstance(node, edit.kind):
            found = type(node).__name__
            raise ValueError(f"mutant {label!r}: {edit.path} is a {found}, not a {edit.kind.__name__}")
        located.append((body, node, edit))
    for body, node, edit in located:
        index = next(position for position, other in enumerate(body) if other is node)
        body[index : index + 1] = [] if edit.source is None else ast.parse(textwrap.dedent(edit.source)).body
    ast.fix_missing_locations(tree)
    return _compiled(plain, tree, label)


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
