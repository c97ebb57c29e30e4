"""The impl mutant corpus: every mutant is the real impl with exactly one bug, the real impl is
never touched, and the harness catches every mutant while passing the unmodified impl."""

from __future__ import annotations

import ast
import inspect

import pytest

from devtools import mutants
from devtools.mutants_corpus import COMPONENTS, MUTANTS, Mutant
from kvsched.impl.lowering import execute_round, lower_decode, lower_round
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.scheduler import RequestScheduler
from kvsched.testing.checks import CheckFailed, CheckFailure, FailureKind
from kvsched.testing.patching import Statement, patch_source, patch_statements, swap, without_comments


def test_the_corpus_has_distinct_mutants_of_every_component() -> None:
    assert len(MUTANTS) >= 12
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
    assert {mutant.component for mutant in MUTANTS} == set(COMPONENTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_a_mutant_overrides_one_seam_and_leaves_impl_alone(mutant: Mutant) -> None:
    base = COMPONENTS[mutant.component]
    before = {name: getattr(base, name) for name in dir(base)}
    kernel_source = inspect.getsource(mutant.kernel) if mutant.kernel is not None else None
    broken = mutant.build()
    assert issubclass(broken, base) and set(vars(broken)) - {"__module__", "__doc__", "__dict__", "__weakref__"} == {
        mutant.seam
    }
    assert getattr(broken, mutant.seam) is not getattr(base, mutant.seam)
    assert {name: getattr(base, name) for name in dir(base)} == before  # the real class is untouched
    if mutant.kernel is not None:
        assert inspect.getsource(mutant.kernel) == kernel_source


def test_a_seam_is_a_small_method_of_the_real_impl() -> None:
    """A seam mutant overrides a method the real class has, in a few lines, with the same
    parameters: the bug is in plain sight, and renaming a local in impl cannot break it."""
    for mutant in MUTANTS:
        if mutant.override is None:
            continue
        real = getattr(COMPONENTS[mutant.component], mutant.seam)
        assert list(inspect.signature(real).parameters) == list(inspect.signature(mutant.override).parameters)
        assert len(inspect.getsource(mutant.override).splitlines()) <= 10, mutant.name


def test_a_statement_address_that_no_longer_fits_fails_loudly() -> None:
    with pytest.raises(ValueError, match="is a For, not a If"):
        patch_statements(lower_round, (Statement((5,), ast.If),), "stale")
    with pytest.raises(ValueError, match="no statement at"):
        patch_statements(lower_round, (Statement((5, 99), ast.Assign),), "stale")


def test_a_statement_edit_ignores_names_and_comments() -> None:
    """An address names a position, so the same edit fits a function whose locals are renamed."""

    def first(x: int) -> int:
        y = x + 1  # one more
        return y

    def renamed(value: int) -> int:
        # a comment moves no statement
        result = value + 1
        return result

    for function in (first, renamed):
        edits = (Statement((0,), ast.Assign, "y = 41"), Statement((1,), ast.Return, "return y"))
        patched = patch_statements(function, edits, "toy")
        assert patched(0) == 41


def test_a_text_patch_that_no_longer_fits_the_source_fails_loudly() -> None:
    with pytest.raises(ValueError, match="occurs 0 times"):
        patch_source(BlockPool.writable, (("if count == 7:", "if count == 8:"),), "stale")


def test_a_text_patch_matches_code_only_so_rewording_a_comment_cannot_break_it() -> None:
    source = 'def f(x):\n    y = x + 1  # one more\n    # a note\n    return "#" + str(y)  # a string keeps its "#"\n'
    assert without_comments(source) == 'def f(x):\n    y = x + 1\n\n    return "#" + str(y)\n'
    assert "every id is in range" in inspect.getsource(PrefixKvStore._exchange)  # a comment there...
    with pytest.raises(ValueError, match="occurs 0 times"):  # ...that no edit can name
        patch_source(PrefixKvStore._exchange, (("# every id is in range: retained", "# reworded"),), "comment")


def test_swap_rebinds_only_the_copies() -> None:
    patched = patch_source(lower_round, (('item["reserved"] = 0', 'item["reserved"] = 1'),), "reserved")
    method = swap(RequestScheduler.execute_decode_round, lower_round, patched)
    assert method is not RequestScheduler.execute_decode_round
    copied_round = method.__globals__["execute_round"]
    copied_lower = copied_round.__globals__["lower_decode"]
    assert copied_round is not execute_round and copied_lower is not lower_decode
    assert copied_lower.__globals__["lower_round"] is patched
    assert lower_decode.__globals__["lower_round"] is lower_round
    with pytest.raises(ValueError, match="never calls"):
        swap(BlockPool.allocate, lower_round, patched)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_failures_are_attributed_to_their_check(kind: FailureKind) -> None:
    """The report reads the kind off the failure the machine raised, whatever its message."""
    assert mutants.classify(CheckFailed(CheckFailure(kind, "any words at all"))) == kind.value
    assert mutants.classify(KeyError(kind.value)) == "error: KeyError"


def test_a_failing_program_is_read_back_call_by_call_even_when_a_call_spans_lines() -> None:
    error = AssertionError("x")
    error.add_note(
        "state = KvschedMachine()\nstate.admit(form='int', prefix=0, request_id=0)\n"
        "# Admit(request_id=0, prefix=None)\n"
        "state.out_of_domain(\n    event=Publish(identity=None, pages=(0,), tokens=1)\n)\n"
        "state.teardown()\n\nYou can reproduce this test case by ..."
    )
    assert mutants.program_of(error) == [
        "state.admit(form='int', prefix=0, request_id=0)",
        "state.out_of_domain(\nevent=Publish(identity=None, pages=(0,), tokens=1)\n)",
        "state.teardown()",
    ]
