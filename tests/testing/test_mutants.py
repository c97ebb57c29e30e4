"""The impl mutant corpus: every mutant is the real impl with exactly one bug, the real impl is
never touched, and the harness catches every mutant while passing the unmodified impl."""

from __future__ import annotations

import inspect

import pytest

from devtools import mutants
from devtools.mutants_corpus import COMPONENTS, MUTANTS, Mutant
from kvsched.impl.lowering import execute_round, lower_round
from kvsched.impl.pool import BlockPool
from kvsched.impl.scheduler import RequestScheduler
from kvsched.testing.checks import CheckFailed, CheckFailure, FailureKind
from kvsched.testing.patching import patch_source, swap, without_comments


def test_the_corpus_has_distinct_mutants_of_every_component() -> None:
    assert len(MUTANTS) >= 12
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
    assert {mutant.component for mutant in MUTANTS} == set(COMPONENTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_a_mutant_overrides_one_method_and_leaves_impl_alone(mutant: Mutant) -> None:
    base = COMPONENTS[mutant.component]
    before = {name: getattr(base, name) for name in dir(base)}
    source = inspect.getsource(mutant.target)
    broken = mutant.build()
    assert issubclass(broken, base) and set(vars(broken)) - {"__module__", "__doc__", "__dict__", "__weakref__"} == {
        mutant.method
    }
    assert getattr(broken, mutant.method) is not getattr(base, mutant.method)
    assert {name: getattr(base, name) for name in dir(base)} == before  # the real class is untouched
    assert inspect.getsource(mutant.target) == source


def test_a_patch_that_no_longer_fits_the_source_fails_loudly() -> None:
    with pytest.raises(ValueError, match="occurs 0 times"):
        patch_source(BlockPool.writable, (("if count == 7:", "if count == 8:"),), "stale")


def test_a_patch_matches_code_only_so_rewording_a_comment_cannot_break_it() -> None:
    source = 'def f(x):\n    y = x + 1  # one more\n    # a note\n    return "#" + str(y)  # a string keeps its "#"\n'
    assert without_comments(source) == 'def f(x):\n    y = x + 1\n\n    return "#" + str(y)\n'
    assert "the source stays held" in inspect.getsource(BlockPool.writable)  # a comment there...
    with pytest.raises(ValueError, match="occurs 0 times"):  # ...that no edit can name
        patch_source(BlockPool.writable, (("# count > 1: the source stays held", "# reworded"),), "comment")


def test_swap_rebinds_only_the_copies() -> None:
    patched = patch_source(lower_round, (('item["reserved"] = 0', 'item["reserved"] = 1'),), "reserved")
    method = swap(RequestScheduler.execute_decode_round, lower_round, patched)
    assert method is not RequestScheduler.execute_decode_round
    copied_round = method.__globals__["execute_round"]
    assert copied_round is not execute_round and copied_round.__globals__["lower_round"] is patched
    assert execute_round.__globals__["lower_round"] is lower_round
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
