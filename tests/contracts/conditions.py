"""Shared by the contract tests: a contract function by qualified name, and its PEP 316 conditions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crosshair.condition_parser import Pep316Parser
from crosshair.fnutil import FunctionInfo


def function(qualname: str) -> Callable[..., Any]:
    """The function `module.name` names."""
    module_name, _, name = qualname.rpartition(".")
    found: Callable[..., Any] = getattr(__import__(module_name, fromlist=[name]), name)
    return found


def conditions(target: Callable[..., Any]) -> Any:
    """CrossHair's parse of the function's `pre:`/`post:` lines (it must have postconditions)."""
    parsed = Pep316Parser().get_fn_conditions(FunctionInfo.from_fn(target))
    assert parsed is not None and parsed.post, f"{target.__name__} has no postconditions"
    return parsed
