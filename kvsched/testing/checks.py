"""The one step checker every harness shares, for every registered component.

A harness runs an event, captures its `Outcome` (`kvsched.testing.outcome`), and asks
`check_step(before, event, outcome, after, reference)` what went wrong: None or a `CheckFailure`
of one `FailureKind`, decided in this order for every component:

1. an untyped error;
2. lockstep: the reference's outcome or state after the same event differs;
3. atomicity: an event that raised changed the state;
4. a read-only query changed the state;
5. the component's own step checks (`kvsched.testing.registry`: the system's refused aliased
   round, LIFO reuse and exclusive writes; the engine's batch limits);
6. the component's invariants (when the program keeps the ownership model).

The component is the one the event is registered under, unless the caller names another (a
component registered in a test). Ghost reads, cached content, determinism and liveness need
more than one step; their checkers report the same kinds.
"""

from __future__ import annotations

from typing import Any

from kvsched.testing.component import Component, StepContext
from kvsched.testing.outcome import CheckFailed, CheckFailure, FailureKind, Outcome, capture, normalize
from kvsched.testing.registry import SYSTEM, component_of

__all__ = [
    "CheckFailed",
    "CheckFailure",
    "FailureKind",
    "Outcome",
    "capture",
    "check_state",
    "check_step",
    "normalize",
]


def check_state(state: Any, component: Component = SYSTEM) -> CheckFailure | None:
    """Every invariant of `component` on one state."""
    broken = component.broken(state)
    return CheckFailure(FailureKind.INVARIANT, ", ".join(broken)) if broken else None


def check_step(
    before: Any,
    event: Any,
    outcome: Outcome,
    after: Any,
    reference: tuple[Outcome, Any] | None = None,
    *,
    component: Component | None = None,
    config: Any = None,
    results: bool = True,
    ownership: bool = True,
    invariants: bool = True,
) -> CheckFailure | None:
    """What is wrong with one step, or None.

    `reference`: the reference's outcome and state after the same event from the same state
    (lockstep); `config`: what the component's own checks need (the system's page size, with
    which a committed round's writes are checked; an engine's `EngineConfig`); `results`:
    compare returned values, not only error types and states; `ownership`: the caller kept the
    ownership model (else only lockstep, atomicity and the checks that hold for any program, for
    a caller that releases pages it does not own on purpose); `invariants`: check them on `after`
    (a caller that has already checked an equal state skips them)."""
    component = component or component_of(event)
    if not outcome.typed:
        return CheckFailure(FailureKind.UNTYPED, f"{event!r} raised {outcome.summary()}")
    if reference is not None:
        expected, expected_after = reference
        mine, theirs = outcome.summary(results), expected.summary(results)
        if mine != theirs:
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r} gave {mine}, the reference {theirs}")
        if after != expected_after:
            return CheckFailure(FailureKind.LOCKSTEP, f"{event!r} left {after}, the reference {expected_after}")
    if outcome.error is not None:
        if after != before:
            return CheckFailure(FailureKind.ATOMICITY, f"{event!r} raised {outcome.error.__name__} but changed state")
        return None
    if component.event_spec(event).read_only and after != before:
        return CheckFailure(FailureKind.READ_ONLY, f"{event!r} changed state")
    step = StepContext(before, event, outcome, after, config, ownership)
    for check in component.checks:
        if failure := check(step):
            return failure
    return check_state(after, component) if invariants and ownership else None
