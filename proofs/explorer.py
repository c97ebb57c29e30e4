"""Exhaustive bounded model checking of the real spec objects (or any system under test).

Breadth-first search over every state reachable within `Bounds`, running the system's own
code for every operation of the alphabet (operations.py) in every state. It checks:
- every named invariant (`kvsched.spec.invariants`) in every new state;
- an operation that raised changed nothing (`post_failure_changes_nothing`);
- after `ensure_writable` the written page has one owner (`post_written_page_exclusive`);
- freed pages are reused last-in-first-out (`post_lifo_reuse`);
- liveness: from every state, finishing every live request, removing every prefix entry and
  releasing the producer's holds gives every page back (nothing leaks);
- with a `reference`, lockstep: the same result (or error type) and the same post-state.
States are canonical (canon.py), keyed by their interned parts. Search is breadth-first,
so the first violation found has a shortest trace; trace.py prints it as a runnable program.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from kvsched.proofs.canon import Canonicalizer, Renaming
from kvsched.proofs.operations import Bounds, Operation, alphabet, rename, run, static_alphabet, within_budget
from kvsched.proofs.subject import SPEC, Positioner, Subject, snapshot
from kvsched.spec.errors import KvschedError
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.invariants import (
    INVARIANTS,
    check_invariants,
    post_drained_all_free,
    post_failure_changes_nothing,
    post_lifo_reuse,
    post_written_page_exclusive,
)
from kvsched.spec.plan import WritePlan
from kvsched.spec.slots import is_live
from kvsched.spec.system import SystemState

Outcome = tuple[str, Any]
Finding = tuple[str, str] | None  # (kind, detail) of a violation


@dataclass
class Violation:
    """What went wrong, and the shortest path to it (canonical operations from the start).

    `kind`: invariant, atomicity (a refused call changed the state), exclusive write, crash
    (an error outside kvsched's closed set), lockstep (differs from the reference), liveness.
    """

    kind: str
    detail: str
    path: list[Operation]
    operation: Operation | None = None
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


def normalize(value: Any) -> Any:
    """A comparable form of a result: dataclasses by name and fields, numbers as ints."""
    if isinstance(value, WritePlan):  # spec's or impl's: by its steps
        return ("WritePlan", normalize(value.targets()), normalize(value.actions()))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(normalize(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, list | tuple):
        return tuple(normalize(item) for item in value)
    if hasattr(value, "item") and callable(value.item):
        return normalize(value.item())
    return value


def attempt(
    operation: Operation, sut: Any, state: SystemState, bounds: Bounds, results: bool = True
) -> tuple[Outcome, SystemState]:
    """Run one operation; its outcome (the result compared only if `results`) and post-state."""
    try:
        result, external = run(operation, sut, state, bounds)
    except KvschedError as error:
        return ("raises", type(error).__name__), snapshot(sut, state.external)
    except Exception as error:  # a bug in the system under test, reported with its trace
        return ("crashes", repr(error)), snapshot(sut, state.external)
    return ("returns", normalize(result) if results else None), snapshot(sut, external)


def drain(state: SystemState, index_of: Callable[[PrefixIdentity], int]) -> list[Operation]:
    """Finish every live request, remove every entry, release every producer hold."""
    ops = [Operation("finish", (slot.request_id,)) for slot in state.scheduler.slots if is_live(slot)]
    ops += [
        Operation("remove", (index_of(entry.page_set.identity),)) for entry in state.store.entries if entry is not None
    ]
    ops += [Operation("ext_release", (page,)) for page in state.external]
    return ops


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
        self.progress = progress
        self.states: list[SystemState] = []
        self.index: dict[tuple[int, int, int, int], int] = {}  # by `Canonicalizer.key`
        self.parent: list[int] = []
        self.via: list[Operation | None] = []
        self.depth: list[int] = []
        self.result = Exploration(subject.name, reference.name if reference else None, bounds)

    def path(self, index: int) -> list[Operation]:
        """The canonical operations from the initial state to state `index`."""
        ops: list[Operation] = []
        while index > 0:
            operation = self.via[index]
            assert operation is not None
            ops.append(operation)
            index = self.parent[index]
        return ops[::-1]

    def lookup(self, state: SystemState) -> int | None:
        """The index of the explored state in the class of `state` (None if not explored)."""
        return self.index.get(self.canon.key(self.canon.canonical(state)[0]))

    def replay(self, sut: Any, ops: list[Operation]) -> tuple[SystemState, Renaming]:
        """Run canonical `ops` on a fresh `sut` in its own names; its state and canonical renaming."""
        state = snapshot(sut, ())
        for operation in ops:
            back = self.canon.renaming(state).inverse()
            _, state = attempt(rename(operation, back.ids, back.identities, back.pages), sut, state, self.bounds)
        return state, self.canon.renaming(state)

    def _add(
        self, state: SystemState, parent: int, operation: Operation | None, like: SystemState | None = None
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

    def _fail(self, kind: str, detail: str, index: int, operation: Operation | None) -> Exploration:
        self.result.violation = Violation(kind, detail, self.path(index), operation)
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

    def _alphabet(self, index: int) -> list[Operation]:
        """The operations to try from state `index` (none past a budget or the depth bound)."""
        state = self.states[index]
        limit = self.bounds.max_depth
        if (limit is not None and self.depth[index] >= limit) or not within_budget(state, self.bounds):
            return []
        return alphabet(state, self.bounds, self.static)

    def _check_state(self, state: SystemState) -> str:
        self.result.checks += len(INVARIANTS)
        broken = check_invariants(state)
        return f"invariants violated: {', '.join(broken)}" if broken else ""

    def _check_liveness(self, index: int, state: SystemState) -> str:
        sut = self.positioner.at(state)
        current = state
        for operation in drain(state, self.canon.index_of):
            outcome, current = attempt(operation, sut, current, self.bounds)
            if outcome[0] == "raises":
                return f"draining failed at {operation}: {outcome[1]}"
        self.result.checks += 1
        return "" if post_drained_all_free(current) else f"pages leak after draining: refs={current.pool.refs}"

    def _step(self, index: int, state: SystemState, back: Renaming | None, operation: Operation) -> Finding:
        """Run one operation from state `index`; the violation it shows, if any.

        `back` maps canonical names to the names of `state` (None: `state` is canonical).
        """
        real = operation if back is None else rename(operation, back.ids, back.identities, back.pages)
        lockstep = self.reference is not None
        outcome, post = attempt(real, self.positioner.at(state), state, self.bounds, lockstep)
        self.result.transitions += 1
        if outcome[0] == "crashes":
            return "crash", f"{real} raised {outcome[1]}, not a kvsched error"
        if self.reference is not None:
            expected, reference_post = attempt(real, self.reference.at(state), state, self.bounds)
            if expected != outcome:
                return "lockstep", f"{real} gave {outcome}, the reference {expected}"
            if reference_post != post:
                return "lockstep", f"{real} left {post}, the reference {reference_post}"
        if outcome[0] == "raises":
            self.result.checks += 1
            if not post_failure_changes_nothing(state, post):
                return "atomicity", f"{real} raised {outcome[1]} but changed the state from {state} to {post}"
            return None
        self.result.checks += 1
        if not post_lifo_reuse(state, post):
            return "LIFO", f"{real} took a page off the free stack out of order: {state.pool.free} -> {post.pool.free}"
        if real.kind == "ensure_writable":
            self.result.checks += 1
            if not post_written_page_exclusive(post, *real.args):
                return "exclusive write", f"{real} returned but the written page is shared: {post}"
        _, new = self._add(post, index, operation, state if back is None else None)
        detail = self._check_state(post) if new else ""
        return ("invariant", detail) if detail else None

    def run(self, max_states: int | None = None) -> Exploration:
        """Explore until done, a violation or `max_states` states (never a time limit: the states
        explored are the same on every machine)."""
        start = last = time.perf_counter()
        initial = snapshot(self.positioner.fresh(), ())
        self._add(initial, -1, None)
        if detail := self._check_state(initial):
            return self._fail("invariant", detail, 0, None)
        done = 0
        while done < len(self.states):
            state, back = self._position(done)
            for operation in self._alphabet(done):
                if finding := self._step(done, state, back, operation):
                    self.result.seconds = time.perf_counter() - start
                    return self._fail(*finding, done, operation)
            if detail := self._check_liveness(done, state):
                self.result.seconds = time.perf_counter() - start
                return self._fail("liveness", detail, done, None)
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
