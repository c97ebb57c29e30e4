"""The engine's recurrent-state slots are conserved for every size (z3), the proofs are not
vacuous, and the broken forms (a slot given back twice, a held slot taken) are refuted."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import engine_slots


@pytest.mark.parametrize("name", sorted(engine_slots.transitions()))
def test_every_slot_transition_keeps_the_invariant_at_every_size(name: str) -> None:
    transition = engine_slots.transitions()[name]
    assert engine_slots.preserves(transition) == z3.unsat
    assert engine_slots.enabled(transition) == z3.sat


@pytest.mark.parametrize("name", sorted(engine_slots.broken()))
def test_every_broken_slot_transition_is_refuted(name: str) -> None:
    assert engine_slots.preserves(engine_slots.broken()[name], bounded=True) == z3.sat


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_slots.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 2 and printed.count("refuted") == 2
