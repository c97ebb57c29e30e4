"""The automatic prefix cache's references are conserved for every size (z3), the proofs are not
vacuous, the broken forms are refuted, and keys of different salts never meet."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import cache_conservation


@pytest.mark.parametrize("name", sorted(cache_conservation.transitions()))
def test_every_cache_transition_keeps_the_invariant_at_every_size(name: str) -> None:
    transition = cache_conservation.transitions()[name]
    assert cache_conservation.preserves(transition) == z3.unsat
    assert cache_conservation.enabled(transition) == z3.sat


@pytest.mark.parametrize("name", sorted(cache_conservation.broken()))
def test_every_broken_cache_transition_is_refuted(name: str) -> None:
    assert cache_conservation.preserves(cache_conservation.broken()[name], bounded=True) == z3.sat


def test_keys_of_different_salts_never_meet_unless_the_hash_or_the_root_is_broken() -> None:
    depths = range(cache_conservation.DEPTH + 1)
    assert all(cache_conservation.salts_separate(a, b) == z3.unsat for a in depths for b in depths)
    assert cache_conservation.salts_separate(1, 2, injective=False) == z3.sat
    assert cache_conservation.unsalted_keys_collide(3) == z3.unsat


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cache_conservation.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 6 and printed.count("refuted") == 5
