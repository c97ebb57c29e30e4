"""The impl mutant corpus: every mutant is the real impl with exactly one bug, the real impl is
never touched, and the harness catches every mutant while passing the unmodified impl."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from devtools import mutants
from devtools.mutants_corpus import COMPONENTS, MUTANTS, Mutant
from kvsched.impl.lowering import execute_round, lower_round
from kvsched.impl.pool import BlockPool
from kvsched.impl.scheduler import RequestScheduler
from kvsched.testing.patching import patch_source, swap


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


def test_swap_rebinds_only_the_copies() -> None:
    patched = patch_source(lower_round, (('item["reserved"] = 0', 'item["reserved"] = 1'),), "reserved")
    method = swap(RequestScheduler.execute_decode_round, lower_round, patched)
    assert method is not RequestScheduler.execute_decode_round
    copied_round = method.__globals__["execute_round"]
    assert copied_round is not execute_round and copied_round.__globals__["lower_round"] is patched
    assert execute_round.__globals__["lower_round"] is lower_round
    with pytest.raises(ValueError, match="never calls"):
        swap(BlockPool.allocate, lower_round, patched)


@pytest.mark.parametrize(
    ("message", "checker"),
    [
        ("finish(3) raised an untyped IndexError: x", "untyped error"),
        ("fork(1, 2) raised Exhausted but changed state", "atomicity"),
        ("pool.release(2): a page left the free stack out of order", "LIFO order"),
        ("admit(1): system raised Full, spec raised DuplicateRequest", "lockstep: error type"),
        ("query: system returned 1, spec 2", "lockstep: result"),
        ("reclaim(1): states diverge from the spec", "lockstep: state"),
        ("invariants violated: inv_free_stack_exact", "invariant: inv_free_stack_exact"),
        ("wrong KV read: request 1 position 0", "ghost read"),
        ("ensure_writable(1, 0) left the written page shared", "post: exclusive write"),
        ("leak: 2 pages still held", "liveness"),
    ],
)
def test_failures_are_attributed_to_their_check(message: str, checker: str) -> None:
    assert mutants.classify(AssertionError(message)) == checker
    assert mutants.classify(KeyError(message)) == "error: KeyError"


def test_the_harness_catches_every_mutant_and_passes_the_real_impl(tmp_path: Path) -> None:
    report = tmp_path / "mutants.json"
    assert mutants.main(["--json", str(report)]) == 0
    verdicts = json.loads(report.read_text())
    control, caught = verdicts[0], verdicts[1:]
    assert control["mutant"] == mutants.CONTROL and not control["caught"] and control["examples"] >= 400
    assert len(caught) == len(MUTANTS) and all(verdict["caught"] for verdict in caught)
    assert all(not verdict["checker"].startswith(("harness", "worker")) for verdict in caught)
