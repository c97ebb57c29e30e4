"""The small z3 models (the engine's state slots, the prefix cache's conservation, the evictable
reserve, the tiered cache's holders): every transition keeps its invariant at every size and is
enabled somewhere (the proof is not vacuous), and every broken form is refuted at a bounded size."""

from __future__ import annotations

from types import ModuleType

import pytest
import z3

from kvsched.proofs import cache_conservation, engine_slots, index_fold, reserve_safety, tier_safety

MODELS: tuple[ModuleType, ...] = (engine_slots, cache_conservation, reserve_safety, tier_safety, index_fold)
TRANSITIONS = [(model, name) for model in MODELS for name in sorted(model.transitions())]
BROKEN = [(model, name) for model in MODELS for name in sorted(model.broken())]


def _id(case: tuple[ModuleType, str]) -> str:
    return f"{case[0].__name__.rsplit('.', 1)[-1]}:{case[1]}"


@pytest.mark.parametrize("case", TRANSITIONS, ids=_id)
def test_every_transition_keeps_the_invariant_at_every_size(case: tuple[ModuleType, str]) -> None:
    model, name = case
    transition = model.transitions()[name]
    assert model.preserves(transition) == z3.unsat
    assert model.enabled(transition) == z3.sat


@pytest.mark.parametrize("case", BROKEN, ids=_id)
def test_every_broken_form_is_refuted(case: tuple[ModuleType, str]) -> None:
    model, name = case
    assert model.preserves(model.broken()[name], bounded=True) == z3.sat
