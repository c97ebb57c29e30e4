"""The KV groups' window arithmetic in z3 (`kvsched.proofs.window_rules`): every lemma proved at
every size, every broken form refuted, and the bounds tight (one page fewer is refuted)."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import window_rules


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert window_rules.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 8 and printed.count("refuted") == 3


def test_the_page_bounds_are_tight() -> None:
    assert window_rules.pages_bounded(window_rules._window, 0) == z3.sat
    assert window_rules.pages_bounded(window_rules._chunked, -1) == z3.sat


def test_a_release_one_position_early_is_caught_by_the_lemma_not_by_construction() -> None:
    """The lemma reads with the true rule and releases with the one given: a rule that releases
    what the true one still reads is refuted; the true rule against itself is proved."""
    assert window_rules.released_never_read(window_rules._window, window_rules._early) == z3.sat
    assert window_rules.released_never_read(window_rules._window, window_rules._window) == z3.unsat
