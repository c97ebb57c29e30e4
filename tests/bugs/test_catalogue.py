"""Every known bug is listed once and caught where it is realised, by the check the catalogue names.

A spec variant must be caught by the stateful machine and by the explorer, both without a
reference and both with the same `FailureKind`; the explorer's failure and shortest program must
match the bug's golden file (`KVSCHED_UPDATE_GOLDEN=1` rewrites them after a deliberate change).
An impl mutant must be caught by the machine in lockstep with the spec, with its named kind,
and, where the catalogue says `explored`, by the explorer in lockstep as well.
The encodings and contract targets are refuted by the proofs' and the gate's own tests, the
wrong reserves by the reserve's machine and explorer (`tests/impl/test_reserve.py`) and the
broken managers by safety mode (`tests/testing/test_safety.py`); here the catalogue only has to
list each of them, and every corpus must be one it knows (`CORPORA`).
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import fields
from pathlib import Path

import pytest

from devtools.mutants import hunt, mutant_system
from devtools.mutants_corpus import MUTANTS
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.operations import Bounds
from kvsched.proofs.subject import SPEC, Subject, variant
from kvsched.proofs.trace import reproduce
from kvsched.testing.bounded import bounded
from kvsched.testing.campaign import run_machine
from kvsched.testing.checks import CheckFailed, FailureKind
from kvsched.testing.machine import KvschedMachine
from kvsched.testing.registry import COMPONENTS
from kvsched.testing.system import SystemConfig
from kvsched.testing.variants import VARIANTS
from tests.bugs.catalogue import CATALOGUE, Bug
from tests.bugs.listing import listed, listing_problems

GOLDEN = Path(__file__).with_name("golden")
BOUNDS = Bounds(requests=2, pages=3, logical_pages=2, entries=1, entry_pages=2, max_references=2, max_external=1)
STATES = 20_000  # a variant the explorer has not caught by then fails the test
HUNT = bounded(3000, 60, shrink=False)


CORPORA = tuple(corpus for component in COMPONENTS for corpus in component.corpora)


def test_every_realisation_is_listed_under_exactly_one_bug() -> None:
    assert len({bug.id for bug in CATALOGUE}) == len(CATALOGUE)
    assert listing_problems(CATALOGUE, CORPORA) == []
    assert all((bug.variant is None) == (bug.kind is None) for bug in CATALOGUE)


def test_a_corpus_entry_missing_from_the_catalogue_fails_the_listing() -> None:
    """The listing has teeth at both ends: drop the first or the last bug naming a corpus."""
    for corpus in CORPORA:
        naming = [bug for bug in CATALOGUE if listed(bug, corpus.field)]
        for dropped in (naming[0], naming[-1]):
            assert listing_problems([bug for bug in CATALOGUE if bug is not dropped], [corpus]), corpus


VARIANT_BUGS = [bug for bug in CATALOGUE if bug.variant]
MUTANT_BUGS = [bug for bug in CATALOGUE if bug.mutant]


# What each kind's printed program says when it shows the failure (`kvsched.proofs.trace.CHECKS`).
SHOWN = {
    FailureKind.LIFO: "freed pages reused last-in-first-out: False",
    FailureKind.INVARIANT: "invariants violated: ('inv_",
    FailureKind.ATOMICITY: "the refused call changed the state: True",
    FailureKind.EXCLUSIVE: "page reference counts: (",
}
SHOWN_BY_ID = {"aliased-scratch": "DecodeOverlapping() -> ('returns',"}  # a round that should have been refused


def golden_text(bug: Bug, program: str) -> str:
    """A golden file: the bug, the check that caught it, and the explorer's shortest program."""
    return f"bug: {bug.id}\n{bug.sentence}\ncaught by: {bug.kind and bug.kind.value}\n\n{program}"


@pytest.mark.parametrize("bug", VARIANT_BUGS, ids=lambda bug: bug.id)
def test_the_machine_and_the_explorer_catch_a_spec_variant_by_the_same_check(bug: Bug) -> None:
    assert bug.variant is not None
    explorer = Explorer(BOUNDS, variant(bug.variant))
    violation = explorer.run(max_states=STATES).violation
    assert violation is not None and violation.kind is bug.kind, violation
    factory = VARIANTS[bug.variant]
    with pytest.raises(CheckFailed) as caught:
        run_machine(lambda: KvschedMachine(factory, None, SystemConfig(max_references=3)), HUNT)
    assert caught.value.failure.kind is bug.kind, caught.value.failure
    text = golden_text(bug, reproduce(explorer, violation))
    path = GOLDEN / f"{bug.id}.out"
    if os.environ.get("KVSCHED_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with KVSCHED_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the golden program runs, and shows the failure
        exec(compile(path.read_text().split("\n\n", 1)[1], str(path), "exec"), {})
    assert bug.kind is not None and SHOWN_BY_ID.get(bug.id, SHOWN[bug.kind]) in printed.getvalue()


@pytest.mark.parametrize("bug", MUTANT_BUGS, ids=lambda bug: bug.id)
def test_the_machine_in_lockstep_catches_an_impl_mutant_by_the_named_check(bug: Bug) -> None:
    mutant = next(mutant for mutant in MUTANTS if mutant.name == bug.mutant)
    verdict = hunt(mutant.name, mutant_system(mutant), examples=400, steps=40, random_seed=0)
    assert verdict.caught, f"{mutant.name} survived {verdict.examples} examples"
    assert verdict.checker == bug.mutant_kind.value, verdict.failure


@pytest.mark.proof
@pytest.mark.parametrize("bug", [bug for bug in MUTANT_BUGS if bug.explored], ids=lambda bug: bug.id)
def test_the_explorer_in_lockstep_catches_an_impl_mutant(bug: Bug) -> None:
    mutant = next(mutant for mutant in MUTANTS if mutant.name == bug.mutant)
    explorer = Explorer(BOUNDS, Subject(mutant.name, mutant_system(mutant), "", ""), SPEC)
    violation = explorer.run(max_states=3_000).violation
    assert violation is not None and violation.kind is FailureKind.LOCKSTEP, violation


def test_every_corpus_is_a_field_of_the_catalogue() -> None:
    """A corpus a component registers is a field of the catalogue, and every field is a corpus."""
    realisations = {f.name for f in fields(Bug)} - {"id", "sentence", "kind", "mutant_kind", "explored"}
    assert realisations == {corpus.field for corpus in CORPORA}
