"""Exhaustive bounded model checking of the real spec objects (or any system under test).

Breadth-first search over every state reachable within `Bounds`, running the system's own
code for every event of the alphabet (operations.py) in every state. Each step is checked by
`kvsched.testing.checks.check_step`, the checker the stateful machine uses (typed errors,
lockstep with a `reference`, atomicity, LIFO reuse, exclusive writes), and every new state by
every invariant; liveness: from every state, finishing every live request, removing every
prefix entry and releasing the producer's holds gives every page back (nothing leaks).
States are canonical (canon.py), keyed by their interned parts. Search is breadth-first,
so the first violation found has a shortest trace; trace.py prints it as a runnable program.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.proofs.canon import Canonicalizer, Renaming
from kvsched.proofs.operations import Bounds, alphabet, rename, static_alphabet, within_budget
from kvsched.proofs.subject import SPEC, Positioner, Subject, snapshot
from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.invariants import INVARIANTS, post_drained_all_free
from kvsched.spec.slots import is_live
from kvsched.spec.step import apply, holds_after
from kvsched.spec.system import SystemState
from kvsched.testing.backends import backend_for
from kvsched.testing.checks import CheckFailure, FailureKind, Outcome, capture, check_state, check_step


@dataclass
class Violation:
    """What went wrong (the check's kind and what it saw), and the shortest path to it
    (canonical events from the start); `event` is the one that failed (None: the state)."""

    kind: FailureKind
    detail: str
    path: list[Event]
    event: Event | None = None
    program: str = ""


@dataclass
class Exploration:
    """One run of the explorer: what it covered and what it found."""

    subject: str
    reference: str | None
    bounds: Bounds
    states: int = 0
    transitions: int = 0
    checks: int = 0
    depth: int = 0
    seconds: float = 0.0
    complete: bool = False
    violation: Violation | None = None
    invariants: tuple[str, ...] = field(default_factory=lambda: tuple(inv.__name__ for inv in INVARIANTS))

    @property
    def states_per_second(self) -> float:
        """Distinct states discovered per second of search."""
        return self.states / self.seconds if self.seconds > 0 else 0.0


def attempt(
    event: Event, sut: Any, state: SystemState, bounds: Bounds, detailed: bool = True
) -> tuple[Outcome, SystemState]:
    """Run one event on `sut` (loaded with `state`); its outcome (an error's message and details
    only if `detailed`) and post-state."""
    backend = backend_for(event, bounds.page_size)
    outcome = capture(lambda: apply(sut, event, backend), detailed)
    external = state.external if outcome.error is not None else holds_after(state.external, event, outcome.value)
    return outcome, snapshot(sut, external)


def drain(state: SystemState, index_of: Callable[[PrefixIdentity], int]) -> list[Event]:
    """Finish every live request, remove every entry, release every producer hold."""
    events: list[Event] = [ev.Finish(slot.request_id) for slot in state.scheduler.slots if is_live(slot)]
    events += [ev.Remove(entry.page_set.identity) for entry in state.store.entries if entry is not None]
    events += [ev.Release(page) for page in state.external]
    return events


class Explorer:
    """Breadth-first search over the canonical states of one subject."""

    def __init__(
        self,
        bounds: Bounds,
        subject: Subject = SPEC,
        reference: Subject | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.bounds = bounds
        self.subject = subject
        self.canon = Canonicalizer(bounds)
        self.positioner = Positioner(subject, bounds.config())
        self.reference = Positioner(reference, bounds.config()) if reference is not None else None
        self.static = static_alphabet(bounds)
        if not hasattr(self.positioner.fresh(), "overlapping_scratch"):  # an optional capability
            self.static = tuple(event for event in self.static if not isinstance(event, ev.DecodeOverlapping))
        self.progress = progress
        self.states: list[SystemState] = []
        self.index: dict[tuple[int, int, int, int], int] = {}  # by `Canonicalizer.key`
        self.parent: list[int] = []
        self.via: list[Event | None] = []
        self.depth: list[int] = []
        self.result = Exploration(subject.name, reference.name if reference else None, bounds)

    def path(self, index: int) -> list[Event]:
        """The canonical events from the initial state to state `index`."""
        ops: list[Event] = []
        while index > 0:
            operation = self.via[index]
            assert operation is not None
            ops.append(operation)
            index = self.parent[index]
        return ops[::-1]

    def lookup(self, state: SystemState) -> int | None:
        """The index of the explored state in the class of `state` (None if not explored)."""
        return self.index.get(self.canon.key(self.canon.canonical(state)[0]))

    def replay(self, sut: Any, ops: list[Event]) -> tuple[SystemState, Renaming]:
        """Run canonical `ops` on a fresh `sut` in its own names; its state and canonical renaming."""
        state = snapshot(sut, ())
        for operation in ops:
            back = self.canon.renaming(state).inverse()
            _, state = attempt(rename(operation, back.ids, back.identities, back.pages), sut, state, self.bounds)
        return state, self.canon.renaming(state)

    def _add(
        self, state: SystemState, parent: int, operation: Event | None, like: SystemState | None = None
    ) -> tuple[int, bool]:
        canonical, _ = self.canon.canonical(state, like)
        key = self.canon.key(canonical)
        known = self.index.get(key)
        if known is not None:
            return known, False
        index = len(self.states)
        self.index[key] = index
        self.states.append(canonical)
        self.parent.append(parent)
        self.via.append(operation)
        self.depth.append(0 if parent < 0 else self.depth[parent] + 1)
        return index, True

    def _fail(self, failure: CheckFailure, index: int, operation: Event | None) -> Exploration:
        self.result.violation = Violation(failure.kind, failure.detail, self.path(index), operation)
        return self._finish()

    def _finish(self) -> Exploration:
        self.result.states = len(self.states)
        self.result.depth = max(self.depth, default=0)
        return self.result

    def _position(self, index: int) -> tuple[SystemState, Renaming | None]:
        """The state the systems are put in for state `index`, and the map to its names.

        A loadable system is put in the canonical state itself (no renaming); any other is
        replayed along the path, in whatever names that produces.
        """
        if self.positioner.loadable:
            return self.states[index], None
        ops = self.path(index)
        holder: list[tuple[SystemState, Renaming]] = []
        self.positioner.park(lambda sut: holder.append(self.replay(sut, ops)))
        state, renaming = holder[0]
        return state, renaming.inverse()

    def _alphabet(self, index: int) -> list[Event]:
        """The operations to try from state `index` (none past a budget or the depth bound)."""
        state = self.states[index]
        limit = self.bounds.max_depth
        if (limit is not None and self.depth[index] >= limit) or not within_budget(state, self.bounds):
            return []
        return alphabet(state, self.bounds, self.static)

    def _check_state(self, state: SystemState) -> CheckFailure | None:
        self.result.checks += len(INVARIANTS)
        return check_state(state)

    def _check_liveness(self, state: SystemState) -> CheckFailure | None:
        sut = self.positioner.at(state)
        current = state
        for event in drain(state, self.canon.index_of):
            outcome, current = attempt(event, sut, current, self.bounds)
            if outcome.error is not None:
                return CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}: {outcome.summary()}")
        self.result.checks += 1
        if post_drained_all_free(current):
            return None
        return CheckFailure(FailureKind.LIVENESS, f"pages leak after draining: refs={current.pool.refs}")

    def _step(self, index: int, state: SystemState, back: Renaming | None, event: Event) -> CheckFailure | None:
        """Run one event from state `index`; the violation it shows, if any.

        `back` maps canonical names to the names of `state` (None: `state` is canonical).
        """
        real = event if back is None else rename(event, back.ids, back.identities, back.pages)
        lockstep = self.reference is not None
        outcome, post = attempt(real, self.positioner.at(state), state, self.bounds, lockstep)
        self.result.transitions += 1
        reference = None
        if self.reference is not None:
            reference = attempt(real, self.reference.at(state), state, self.bounds)
        self.result.checks += 1
        if failure := check_step(
            state, real, outcome, post, reference, results=lockstep, invariants=False, config=self.bounds.page_size
        ):
            return failure
        if outcome.error is not None:
            return None
        _, new = self._add(post, index, event, state if back is None else None)
        return self._check_state(post) if new else None

    def run(self, max_states: int | None = None) -> Exploration:
        """Explore until done, a violation or `max_states` states (never a time limit: the states
        explored are the same on every machine)."""
        start = last = time.perf_counter()
        initial = snapshot(self.positioner.fresh(), ())
        self._add(initial, -1, None)
        if failure := self._check_state(initial):
            return self._fail(failure, 0, None)
        done = 0
        while done < len(self.states):
            state, back = self._position(done)
            for operation in self._alphabet(done):
                if failure := self._step(done, state, back, operation):
                    self.result.seconds = time.perf_counter() - start
                    return self._fail(failure, done, operation)
            if failure := self._check_liveness(state):
                self.result.seconds = time.perf_counter() - start
                return self._fail(failure, done, None)
            done += 1
            now = time.perf_counter()
            if self.progress is not None and now - last > 2.0:
                last = now
                rate = len(self.states) / (now - start)
                self.progress(
                    f"  {self.subject.name}: {len(self.states):,} states ({done:,} expanded), "
                    f"{self.result.transitions:,} transitions, depth {self.depth[done - 1]}, {rate:,.0f} states/s"
                )
            if max_states is not None and len(self.states) >= max_states:
                self.result.seconds = now - start
                return self._finish()
        self.result.seconds = time.perf_counter() - start
        self.result.complete = True
        return self._finish()


def explore(
    bounds: Bounds,
    subject: Subject = SPEC,
    reference: Subject | None = None,
    *,
    max_states: int | None = None,
    progress: bool = False,
) -> Exploration:
    """Explore every reachable state of `subject` within `bounds` (see `Explorer`)."""
    report = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    return Explorer(bounds, subject, reference, report).run(max_states)
