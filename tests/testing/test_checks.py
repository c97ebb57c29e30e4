"""`check_step` reports each kind it owns: every branch is shown to fail on a step that breaks it.

The catalogue (`tests/bugs`) shows the kinds its broken variants trip (lockstep, atomicity, LIFO,
exclusive write, invariant); the untyped-error and read-only branches have no broken variant,
so they are shown here on hand-made steps, beside a clean step that passes every check.
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.spec import events as ev
from kvsched.spec.step import step
from kvsched.spec.system import SystemState
from kvsched.testing.checks import FailureKind, Outcome, capture, check_step
from kvsched.testing.system import SystemConfig, spec_system

FRESH = SystemState(*spec_system(SystemConfig()).snapshot())


def admitted() -> tuple[SystemState, Outcome, SystemState]:
    after, value = step(FRESH, ev.Admit(1))
    return FRESH, Outcome(value), after


def test_a_clean_step_passes_every_check() -> None:
    before, outcome, after = admitted()
    assert check_step(before, ev.Admit(1), outcome, after, (outcome, after)) is None


def test_an_untyped_error_is_reported() -> None:
    outcome = capture(lambda: [][1])
    failure = check_step(FRESH, ev.Finish(1), outcome, FRESH)
    assert failure is not None and failure.kind is FailureKind.UNTYPED


def test_a_read_that_changes_the_state_is_reported() -> None:
    _, _, changed = admitted()
    failure = check_step(FRESH, ev.Read(), Outcome(()), changed)
    assert failure is not None and failure.kind is FailureKind.READ_ONLY


def test_a_refusal_that_changes_the_state_is_reported() -> None:
    _, _, changed = admitted()
    refused = capture(lambda: step(FRESH, ev.Finish(9)))
    failure = check_step(FRESH, ev.Finish(9), refused, changed)
    assert failure is not None and failure.kind is FailureKind.ATOMICITY


def test_a_different_reference_is_reported() -> None:
    before, outcome, after = admitted()
    other = replace(after, external=(0,))
    failure = check_step(before, ev.Admit(1), outcome, after, (outcome, other))
    assert failure is not None and failure.kind is FailureKind.LOCKSTEP


def test_a_state_that_breaks_an_invariant_is_reported() -> None:
    after, page = step(FRESH, ev.Allocate())
    leaked = replace(after, external=())  # the holder forgot the page it allocated
    failure = check_step(FRESH, ev.Allocate(), Outcome(page), leaked)
    assert failure is not None and failure.kind is FailureKind.INVARIANT
