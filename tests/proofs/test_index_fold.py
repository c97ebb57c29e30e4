"""The router index's fold in z3 (`kvsched.proofs.index_fold`): the proofs print their verdicts,
a batch folded in order never contradicts the view, and a fold that forgets removals, or a
verdict that folds a repeated batch again, is not proved (its transitions and the four upstream
broken forms: `test_small_models.py`)."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs import index_fold
from kvsched.proofs.index_fold import Index


def test_the_proofs_print_their_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert index_fold.main() == 0
    printed = capsys.readouterr().out
    assert printed.count("proved") == 5 and printed.count("refuted") == 4


def test_a_batch_folded_in_order_never_contradicts_the_view() -> None:
    assert index_fold.in_order_never_contradicts() == z3.unsat


def test_a_fold_that_forgets_removals_is_not_proved(monkeypatch: pytest.MonkeyPatch) -> None:
    fold = index_fold.fold

    def forgets_removals(x: Index, held: z3.ArrayRef, batch: z3.ArithRef, *, cleared: bool = True) -> z3.ArrayRef:
        k = z3.Int("k")
        return z3.Lambda([k], z3.Or(fold(x, held, batch, cleared=cleared)[k], held[k]))

    monkeypatch.setattr(index_fold, "fold", forgets_removals)
    assert index_fold.preserves(index_fold.transitions()["deliver"]) == z3.sat


def test_folding_a_repeated_batch_again_is_not_proved() -> None:
    batch = z3.Int("batch")

    def refolds(x: Index, y: Index) -> z3.BoolRef:
        again = index_fold._view(y, x.v_epoch, batch + 1, index_fold.fold(x, x.v_set, batch), z3.BoolVal(False))
        unchanged = index_fold._same(x, y, "v_epoch", "v_next", "v_set", "v_stale")
        return z3.And(z3.Not(x.v_stale), x.v_epoch == x.epoch, batch >= 0, batch < x.v_next - 1, again, unchanged)

    assert index_fold.preserves(refolds) == z3.sat
