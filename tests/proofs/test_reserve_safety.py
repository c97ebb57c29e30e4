"""The evictable reserve's safety at every size (z3): found pages hold their key's content, the
queue is the free pages, the reserved page stays reserved; the proofs are not vacuous and the
broken forms are refuted."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import reserve_safety


@pytest.mark.parametrize("name", sorted(reserve_safety.transitions()))
def test_transition_keeps_the_invariant_at_every_size(name: str) -> None:
    transition = reserve_safety.transitions()[name]
    assert reserve_safety.preserves(transition) == z3.unsat
    assert reserve_safety.enabled(transition) == z3.sat


@pytest.mark.parametrize("name", sorted(reserve_safety.broken()))
def test_broken_form_is_refuted(name: str) -> None:
    assert reserve_safety.preserves(reserve_safety.broken()[name], bounded=True) == z3.sat
