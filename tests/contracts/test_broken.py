"""Every deliberately broken target of the gate really is broken, concretely (no CrossHair): a
known input meets the contract's precondition and breaks a postcondition of the broken copy
only."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pytest

from kvsched.contracts import broken
from tests.contracts.conditions import conditions as _conditions
from tests.contracts.conditions import function as _function


def _holds(conditions: Any, bindings: Mapping[str, object]) -> list[str]:
    return [post.expr_source for post in conditions.post if not post.evaluate(bindings)]


# Inputs CrossHair reported against each broken target (and that the real contract accepts).
BROKEN_INPUTS: dict[str, tuple[object, ...]] = {
    "pool_release": (1, 2, 0, 5, 0),
    "pool_writable": (1, 1, 2, 5, 2),
    "prefix_reclaim": (0, 1, 1, 1, 6, 0, 0, 0, 0, 0, 1),
    "scheduler_admit": (1, 1, 2, 0, 0, 0, 0, 5, 0, 0),
    "kernel_retain_pages": (3, 0, 0, 0, 0, 0, 2, False),
    "kernel_ensure_rows": (0, 1, 0, 1, 0, 0, 0, 4, 1, 0, 1, 0),
}


@pytest.mark.parametrize("name", broken.CHECK_TARGETS)
def test_broken_target_breaks_its_contract(name: str) -> None:
    broken_function = getattr(broken, name)
    original = _function(f"{broken_function.__globals__['__name__']}.{name}")
    assert broken_function.__code__ is original.__code__  # the very same contract, conditions and all
    bindings = dict(zip(inspect.signature(original).parameters, BROKEN_INPUTS[name], strict=True))
    conditions = _conditions(original)
    assert all(pre.evaluate(bindings) for pre in conditions.pre)
    assert not _holds(conditions, {**bindings, "__return__": original(*BROKEN_INPUTS[name])})
    assert _holds(_conditions(broken_function), {**bindings, "__return__": broken_function(*BROKEN_INPUTS[name])})


def test_broken_twins_differ_from_the_spec() -> None:
    from kvsched.contracts import twin_kernels, twin_systems, twin_tables

    assert twin_kernels.spec_ensure(2, 0, 0, 0, 1, 2, 1, 0) != broken.impl_ensure(2, 0, 0, 0, 1, 2, 1, 0)
    assert twin_kernels.spec_retain(0, 1, 1, 1, 3, 0, 2) != broken.impl_retain(0, 1, 1, 1, 3, 0, 2)
    assert twin_kernels.spec_release(2, 2, 0, 5, 1, 2, 3) != broken.impl_release(2, 2, 0, 5, 1, 2, 3)
    assert twin_tables.spec_install(1, 1, 0, 1, 1, 0, 2) != broken.impl_install(1, 1, 0, 1, 1, 0, 2)
    assert twin_systems.spec_pool(0, 1, 1, 2, 1, 0) != broken.impl_pool(0, 1, 1, 2, 1, 0)
    assert twin_systems.spec_writable(2, 1, 2, 2, 0) != broken.impl_writable(2, 1, 2, 2, 0)
    assert twin_systems.spec_store(2, 4, 1, 0, 1, 1, False, 1) != broken.impl_store(2, 4, 1, 0, 1, 1, False, 1)
    fork_unknown_when_full = (0, 1, 0, 2, 3, 3, 0, 0)
    assert twin_systems.spec_scheduler(*fork_unknown_when_full) != broken.impl_scheduler(*fork_unknown_when_full)
    zero_launches = (False, False, True, True, 2, 1, 4)
    assert twin_systems.spec_round(*zero_launches) != broken.impl_round(*zero_launches)
    items_short = (False, False, True, True, 2, 1, 1)
    assert twin_systems.spec_round_buffers(*items_short) != broken.impl_round_buffers(*items_short)
