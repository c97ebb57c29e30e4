"""The engine explorer: every reachable state of a small engine (five candidate requests, a pool
of four pages, two priorities, a state slot each, one prefix entry) is explored with every check
and liveness from every state; impl in lockstep with the spec on a bounded part of it; and the
broken engines it can see (without KV or model faults) are each caught by the named check."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched.proofs.engine_explorer import SMALL, EngineExplorer
from kvsched.testing.checks import FailureKind
from kvsched.testing.engine_machine import impl_engine, spec_engine
from kvsched.testing.engine_variants import ENGINE_VARIANTS

# What the explorer reports for each variant it can see: with the spec beside it, and alone.
CAUGHT = {
    "preempt_to_back": (FailureKind.LOCKSTEP, FailureKind.ORDER),
    "admit_too_large": (FailureKind.LOCKSTEP, FailureKind.LIVENESS),
    "never_preempt": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "full_hit_prefills_nothing": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "skip_memory_guard": (FailureKind.LOCKSTEP, None),
    "state_slot_released_twice": (FailureKind.LOCKSTEP, FailureKind.INVARIANT),
}


def test_every_reachable_state_of_the_spec_engine_passes_every_check() -> None:
    result = EngineExplorer(SMALL, spec_engine).run()
    assert result.violation is None, (result.violation, result.path)
    assert result.complete and result.states > 5_000
    assert result.preemptions > 0 and result.refusals > 0  # pressure and refusals were reached


def test_impl_engine_in_lockstep_on_the_first_states() -> None:
    result = EngineExplorer(replace(SMALL, max_states=1_500), impl_engine, spec_engine).run()
    assert result.violation is None, (result.violation, result.path)
    assert result.states >= 700 and result.preemptions > 0


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_the_explorer_catches_a_broken_engine(name: str) -> None:
    variant = next(variant for variant in ENGINE_VARIANTS if variant.name == name)
    with_reference, alone = CAUGHT[name]
    found = EngineExplorer(SMALL, variant.factory(), spec_engine).run().violation
    assert found is not None and found.kind is with_reference
    if alone is not None:  # None: only the spec can tell
        found = EngineExplorer(SMALL, variant.factory()).run().violation
        assert found is not None and found.kind is alone
