"""The automatic prefix cache: keys of different salts never meet, and the proofs print their
verdicts (its transitions and broken forms: `test_small_models.py`)."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import cache_conservation


def test_keys_of_different_salts_never_meet_unless_the_hash_or_the_root_is_broken() -> None:
    depths = range(cache_conservation.DEPTH + 1)
    assert all(cache_conservation.salts_separate(a, b) == z3.unsat for a in depths for b in depths)
    assert cache_conservation.salts_separate(1, 2, injective=False) == z3.sat
    assert cache_conservation.unsalted_keys_collide(3) == z3.unsat


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cache_conservation.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 6 and printed.count("refuted") == 5
