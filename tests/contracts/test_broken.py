"""Every deliberately broken target of the gate really is broken, concretely and without
CrossHair: its pinned counterexample (`broken.COUNTEREXAMPLES`) meets the contract's precondition
and breaks a postcondition of the broken copy only, or makes the broken pair differ from the spec
where the real pair agrees. The CrossHair search that found them runs in `make contracts`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import pytest

from devtools import broken_contracts as broken
from tests.contracts.conditions import conditions as _conditions
from tests.contracts.conditions import function as _function


def _holds(conditions: Any, bindings: Mapping[str, object]) -> list[str]:
    return [post.expr_source for post in conditions.post if not post.evaluate(bindings)]


def test_every_broken_target_has_a_pinned_counterexample_and_a_search_bound() -> None:
    names = {*broken.CHECK_TARGETS, *(impl_name for _, impl_name in broken.DIFF_TARGETS)}
    assert set(broken.COUNTEREXAMPLES) == names == set(broken.ITERATIONS)


@pytest.mark.parametrize("name", broken.CHECK_TARGETS)
def test_broken_target_breaks_its_contract(name: str) -> None:
    broken_function = getattr(broken, name)
    original = _function(f"{broken_function.__globals__['__name__']}.{name}")
    assert broken_function.__code__ is original.__code__  # the very same contract, conditions and all
    arguments = broken.COUNTEREXAMPLES[name]
    bindings = dict(zip(inspect.signature(original).parameters, arguments, strict=True))
    conditions = _conditions(original)
    assert all(pre.evaluate(bindings) for pre in conditions.pre)
    assert not _holds(conditions, {**bindings, "__return__": original(*arguments)})
    assert _holds(_conditions(broken_function), {**bindings, "__return__": broken_function(*arguments)})


@pytest.mark.parametrize(("spec_name", "impl_name"), broken.DIFF_TARGETS, ids=[name for _, name in broken.DIFF_TARGETS])
def test_broken_pair_differs_from_the_spec_where_the_real_pair_agrees(spec_name: str, impl_name: str) -> None:
    module_name, _, spec_function = spec_name.rpartition(".")
    module = importlib.import_module(module_name)
    spec, real = getattr(module, spec_function), getattr(module, impl_name)
    arguments = broken.COUNTEREXAMPLES[impl_name]
    expected = spec(*arguments)
    assert expected is not None  # inside the pairs' domain
    assert real(*arguments) == expected
    assert getattr(broken, impl_name)(*arguments) != expected
