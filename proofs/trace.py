"""A counterexample as a runnable Python program.

The explorer records a violation as the shortest path of canonical events. `reproduce` replays
it on fresh systems, translating each event back into the names the replayed system actually
uses (canon.py renames request ids, identities and pages), checks that the violation happens
again with `check_step` (the checker that found it), and prints the events as a list. The
program defines `run(system)`, which runs them through `kvsched.spec.step.apply`, runs it on
the subject (and on the reference, for a lockstep divergence) and prints what went wrong.
"""

from __future__ import annotations

from kvsched.proofs.explorer import Explorer, Violation, attempt, drain
from kvsched.proofs.operations import rename
from kvsched.proofs.subject import Subject, snapshot
from kvsched.spec.events import Event
from kvsched.spec.invariants import check_invariants, post_drained_all_free
from kvsched.testing.checks import FailureKind, Outcome, check_step

PREAMBLE = '''"""kvsched explorer counterexample: {kind}.

{detail}
"""

from kvsched.spec import PrefixIdentity
from kvsched.spec.events import *  # noqa: F403
from kvsched.spec.invariants import check_invariants, post_lifo_reuse
from kvsched.spec.step import apply, holds_after
from kvsched.spec.system import SystemState
from kvsched.testing.backends import backend_for
from kvsched.testing.checks import capture
from kvsched.testing.system import SystemConfig
{setup}

CONFIG = {config!r}
PATH = [
{body}
]
LAST = [
{last}
]


def run(system):
    """The shortest path to the violation; the states before and after its last events."""
    external = ()  # the producer's page references
    before = None
    for index, event in enumerate(PATH + LAST):
        if index == len(PATH):
            before = SystemState(*system.snapshot(), external)
        outcome = capture(lambda: apply(system, event, backend_for(event, CONFIG.page_size)))
        print(f"  {{event!r}} -> {{outcome.summary()[:2]}}")
        if outcome.error is None:
            external = holds_after(external, event, outcome.value)
    return before or SystemState(*system.snapshot(), external), SystemState(*system.snapshot(), external)

'''

CHECKS = {
    FailureKind.INVARIANT: """
before, after = run(factory(CONFIG))
print("invariants violated:", check_invariants(after))
""",
    FailureKind.ATOMICITY: """
before, after = run(factory(CONFIG))
print("the refused call changed the state:", before != after)
print("before:", before)
print("after: ", after)
""",
    FailureKind.READ_ONLY: """
before, after = run(factory(CONFIG))
print("the read changed the state:", before != after)
""",
    FailureKind.LIFO: """
before, after = run(factory(CONFIG))
print("freed pages reused last-in-first-out:", post_lifo_reuse(before, after))
print("free stack before:", before.pool.free)
print("free stack after: ", after.pool.free)
""",
    FailureKind.EXCLUSIVE: """
before, after = run(factory(CONFIG))
print("after the write, page reference counts:", after.pool.refs)
""",
    FailureKind.UNTYPED: """
run(factory(CONFIG))
""",
    FailureKind.LIVENESS: """
before, after = run(factory(CONFIG))
print("reference counts after releasing everything:", after.pool.refs)
print("free pages:", len(after.pool.free), "of", len(after.pool.refs))
""",
    FailureKind.LOCKSTEP: """
(_, state), (_, expected) = run(factory(CONFIG)), run(reference(CONFIG))
print("same final state as the reference:", state == expected)
print("system:   ", state)
print("reference:", expected)
""",
}


class Replay:
    """A fresh system driven step by step, recording each event it ran."""

    def __init__(self, explorer: Explorer, subject: Subject) -> None:
        self.explorer = explorer
        self.sut = subject.factory(explorer.bounds.config())
        self.state = snapshot(self.sut, ())
        self.before = self.state
        self.outcome = Outcome()
        self.events: list[Event] = []

    def canonical(self, event: Event) -> Event:
        """Run an event named canonically (as the explorer recorded it); the real one."""
        back = self.explorer.canon.renaming(self.state).inverse()
        real = rename(event, back.ids, back.identities, back.pages)
        self.real(real)
        return real

    def real(self, event: Event) -> None:
        """Run an event in the system's own names."""
        self.before = self.state
        self.outcome, self.state = attempt(event, self.sut, self.state, self.explorer.bounds)
        self.events.append(event)


def _reproduces(explorer: Explorer, violation: Violation, replay: Replay, last: Event | None) -> bool:
    if violation.kind is FailureKind.LIVENESS:
        return not post_drained_all_free(replay.state)
    if violation.kind is FailureKind.INVARIANT:
        return bool(check_invariants(replay.state))
    assert last is not None
    reference = None
    if violation.kind is FailureKind.LOCKSTEP:
        assert explorer.reference is not None
        other = Replay(explorer, explorer.reference.subject)
        for event in violation.path:
            other.canonical(event)
        other.real(last)
        reference = other.outcome, other.state
    bounds = explorer.bounds
    failure = check_step(
        replay.before, last, replay.outcome, replay.state, reference, invariants=False, config=bounds.page_size
    )
    return failure is not None and failure.kind is violation.kind


def reproduce(explorer: Explorer, violation: Violation) -> str:
    """The violation as a runnable program; raises AssertionError if the replay does not show it."""
    replay = Replay(explorer, explorer.subject)
    for event in violation.path:
        replay.canonical(event)
    path_events = len(replay.events)
    last = replay.canonical(violation.event) if violation.event is not None else None
    if violation.kind is FailureKind.LIVENESS:
        for event in drain(replay.state, explorer.canon.index_of):
            replay.real(event)
    if not _reproduces(explorer, violation, replay, last):
        raise AssertionError(f"the {violation.kind.value} violation did not reproduce on replay: {violation.detail}")
    setup = explorer.subject.setup("factory")
    if violation.kind is FailureKind.LOCKSTEP and explorer.reference is not None:
        setup += "\n" + explorer.reference.subject.setup("reference")
    program = PREAMBLE.format(
        kind=violation.kind.value,
        detail=violation.detail[:2000],
        setup=setup,
        config=explorer.bounds.config(),
        body="\n".join(f"    {event!r}," for event in replay.events[:path_events]),
        last="\n".join(f"    {event!r}," for event in replay.events[path_events:]),
    )
    return program + CHECKS[violation.kind]
