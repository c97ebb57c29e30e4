"""A counterexample as a runnable Python program.

The explorer records a violation as the shortest path of canonical operations. `reproduce`
replays it on fresh systems, translating each operation back into the names the replayed
system actually uses (canon.py renames request ids, identities and pages), checks that the
violation happens again, and prints every step as the API call it makes. The program defines
`run(system)`, runs it on the subject (and on the reference, for a lockstep divergence) and
prints what went wrong.
"""

from __future__ import annotations

from kvsched.proofs.explorer import Explorer, Violation, attempt, drain
from kvsched.proofs.operations import Operation, rename, statements
from kvsched.proofs.subject import Subject, snapshot
from kvsched.spec.invariants import (
    check_invariants,
    post_drained_all_free,
    post_lifo_reuse,
    post_written_page_exclusive,
)

PREAMBLE = '''"""kvsched explorer counterexample: {kind}.

{detail}
"""

from kvsched.spec import KvschedError, PrefixPageSet
from kvsched.spec.invariants import check_invariants, post_lifo_reuse
from kvsched.spec.system import SystemState
from kvsched.testing.backends import HarnessBackend
from kvsched.testing.machine import prefix_identity
from kvsched.testing.system import SystemConfig
{setup}

CONFIG = {config!r}


def attempt(call):
    """A call the system must refuse: print the refusal."""
    try:
        call()
    except KvschedError as error:
        print("  refused:", type(error).__name__)
    else:
        print("  NOT refused")


def run(system):
    """The shortest path to the violation; the states before and after its last step."""
    pool, store, scheduler = system.pool, system.store, system.scheduler
    external = []  # the producer's page references
{body}
    before = SystemState(*system.snapshot(), tuple(sorted(external)))
{last}
    return before, SystemState(*system.snapshot(), tuple(sorted(external)))

'''

CHECKS = {
    "invariant": """
before, after = run(factory(CONFIG))
print("invariants violated:", check_invariants(after))
""",
    "atomicity": """
before, after = run(factory(CONFIG))
print("the refused call changed the state:", before != after)
print("before:", before)
print("after: ", after)
""",
    "LIFO": """
before, after = run(factory(CONFIG))
print("freed pages reused last-in-first-out:", post_lifo_reuse(before, after))
print("free stack before:", before.pool.free)
print("free stack after: ", after.pool.free)
""",
    "exclusive write": """
before, after = run(factory(CONFIG))
print("after the write, page reference counts:", after.pool.refs)
""",
    "crash": """
run(factory(CONFIG))
""",
    "liveness": """
before, after = run(factory(CONFIG))
print("reference counts after releasing everything:", after.pool.refs)
print("free pages:", len(after.pool.free), "of", len(after.pool.refs))
""",
    "lockstep": """
(_, state), (_, expected) = run(factory(CONFIG)), run(reference(CONFIG))
print("same final state as the reference:", state == expected)
print("system:   ", state)
print("reference:", expected)
""",
}


class Replay:
    """A fresh system driven step by step, recording each step as program lines."""

    def __init__(self, explorer: Explorer, subject: Subject) -> None:
        self.explorer = explorer
        self.sut = subject.factory(explorer.bounds.config())
        self.state = snapshot(self.sut, ())
        self.before = self.state
        self.outcome: tuple[str, object] = ("returns", None)
        self.lines: list[str] = []

    def canonical(self, operation: Operation) -> Operation:
        """Run an operation named canonically (as the explorer recorded it); the real one."""
        back = self.explorer.canon.renaming(self.state).inverse()
        real = rename(operation, back.ids, back.identities, back.pages)
        self.real(real)
        return real

    def real(self, operation: Operation) -> None:
        """Run an operation in the system's own names."""
        self.before = self.state
        self.outcome, self.state = attempt(operation, self.sut, self.state, self.explorer.bounds)
        self.lines += statements(operation, self.before, self.explorer.bounds, refused=self.outcome[0] == "raises")


def _reproduces(explorer: Explorer, violation: Violation, replay: Replay, last: Operation | None) -> bool:
    if violation.kind == "liveness":
        return not post_drained_all_free(replay.state)
    if violation.kind == "lockstep":
        assert explorer.reference is not None
        reference = Replay(explorer, explorer.reference.subject)
        for operation in violation.path:
            reference.canonical(operation)
        if last is not None:
            reference.real(last)
        return (reference.outcome, reference.state) != (replay.outcome, replay.state)
    if violation.kind == "atomicity":
        return replay.outcome[0] == "raises" and replay.state != replay.before
    if violation.kind == "crash":
        return replay.outcome[0] == "crashes"
    if violation.kind == "LIFO":
        return not post_lifo_reuse(replay.before, replay.state)
    if violation.kind == "exclusive write" and last is not None:
        return not post_written_page_exclusive(replay.state, *last.args)
    return bool(check_invariants(replay.state))


def reproduce(explorer: Explorer, violation: Violation) -> str:
    """The violation as a runnable program; raises AssertionError if the replay does not show it."""
    replay = Replay(explorer, explorer.subject)
    for operation in violation.path:
        replay.canonical(operation)
    path_lines = len(replay.lines)
    last = replay.canonical(violation.operation) if violation.operation is not None else None
    if violation.kind == "liveness":
        for operation in drain(replay.state, explorer.canon.index_of):
            replay.real(operation)
    if not _reproduces(explorer, violation, replay, last):
        raise AssertionError(f"the {violation.kind} violation did not reproduce on replay: {violation.detail}")
    body = "\n".join(f"    {line}" for line in replay.lines[:path_lines]) or "    pass"
    final = "\n".join(f"    {line}" for line in replay.lines[path_lines:]) or "    pass"
    setup = explorer.subject.setup("factory")
    if violation.kind == "lockstep" and explorer.reference is not None:
        setup += "\n" + explorer.reference.subject.setup("reference")
    program = PREAMBLE.format(
        kind=violation.kind,
        detail=violation.detail[:2000],
        setup=setup,
        config=explorer.bounds.config(),
        body=body,
        last=final,
    )
    return program + CHECKS[violation.kind]
