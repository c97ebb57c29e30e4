"""The breadth-first search every explorer shares.

From a start state, every event of a state's alphabet runs on systems positioned at that state
(the system under test and, when there is one, the reference beside it); every step is checked
by `kvsched.testing.checks.check_step` with the component's own checks, then by the explorer's
own observations; a new state (by its key) is numbered, queued and checked against every
invariant; once a state's events have run, liveness is checked from it. Search is breadth-first,
so the first violation found has a shortest path, and it is bounded by states and depth, never
by time: the same states are searched on every machine.

What differs between explorers are hooks: how a state's systems are positioned (a copy of the
systems that reached it, or a system loaded with the kept state), the key under which a state is
kept (canonical names, clock ranks), the alphabet, the extra checks and liveness. Subclasses:
`kvsched.proofs.explorer.Explorer` (the pool, store and scheduler), `.engine_explorer.EngineExplorer`
and `.component_explorer.ComponentExplorer` (any registered component, by its registration alone).
"""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any

from kvsched.spec.step import apply
from kvsched.testing.checks import check_state, check_step
from kvsched.testing.component import Component
from kvsched.testing.outcome import CheckFailure, FailureKind, Outcome, capture


@dataclass
class Violation:
    """What went wrong (the check's kind and what it saw), and the shortest path to it
    (the events as kept, from the start); `event` is the one that failed (None: the state)."""

    kind: FailureKind
    detail: str
    path: list[Any]
    event: Any | None = None
    program: str = ""


@dataclass
class Node:
    """What the search keeps of a queued state besides the state: the systems that reached it
    (the system under test and the reference) and whatever else its explorer keeps of its history
    (the engine's explorer: which requests were submitted). An explorer that loads its systems
    from the kept state keeps nothing here."""

    sut: Any = None
    ref: Any = None
    history: Any = None


@dataclass
class Attempt:
    """One event run from a positioned state: the event as run (in the systems' own names), its
    outcome, the state after it, the reference's outcome and state, and the child's node."""

    event: Any
    outcome: Outcome
    after: Any
    reference: tuple[Outcome, Any] | None
    child: Node


@dataclass
class Searched:
    """What a search covered, and its first failure with the shortest path to it."""

    states: int = 0
    transitions: int = 0
    checks: int = 0
    depth: int = 0
    seconds: float = 0.0
    complete: bool = False
    violation: Violation | None = None


def run_event(system: Any, event: Any) -> Outcome:
    """`event` on an object system, caught."""
    return capture(lambda: apply(system, event))


class Search(ABC):
    """Breadth-first search over a component's states (see the module docstring).

    Found states are numbered in the order found: `states[i]` is kept under its key in `index`,
    reached from `parent[i]` by `via[i]` at `depth[i]`. The hooks' defaults are a registered
    component's: systems copied per branch, a state its own key, every entry's `explore` ranges."""

    max_depth: int | None = None  # events are not tried from states this deep

    def __init__(self, component: Component, config: Any) -> None:
        self.component, self.config = component, config
        self.states: list[Any] = []
        self.index: dict[Any, int] = {}
        self.parent: list[int] = []
        self.via: list[Any] = []
        self.depth: list[int] = []
        self.searched = Searched()
        self._started = time.perf_counter()

    # -- hooks ---------------------------------------------------------------------------------

    @abstractmethod
    def start(self) -> Node:
        """The initial state's node."""

    def initial(self, node: Node) -> Any:
        """The initial state (the abstraction of the start node's system)."""
        return self.component.abstraction(node.sut)

    def position(self, index: int, node: Node) -> tuple[Any, Any]:
        """What running events from state `index` needs, and the state in its systems' names."""
        return node, self.states[index]

    def events(self, at: Any, state: Any) -> list[Any]:
        """The alphabet in `state` (each entry's `explore` ranges)."""
        ranges = [entry.explore for entry in self.component.events if entry.explore is not None]
        return [event for explore in ranges for event in explore(state, self.config)]

    def attempt(self, at: Any, state: Any, event: Any) -> Attempt:
        """Run `event` on copies of the node's systems."""
        mine, theirs = copy.deepcopy(at.sut), copy.deepcopy(at.ref)
        self.prepare(mine, theirs, event)
        outcome = run_event(mine, event)
        reference = None if theirs is None else (run_event(theirs, event), self.component.abstraction(theirs))
        child = Node(mine, theirs, self.history(at, event))
        return Attempt(event, outcome, self.component.abstraction(mine), reference, child)

    def prepare(self, mine: Any, theirs: Any, event: Any) -> None:
        """Called on the copies an attempt runs `event` on, before it runs (default: nothing)."""
        return None

    def history(self, node: Node, event: Any) -> Any:
        """What the child of `node` by `event` keeps of its history."""
        return node.history

    def kept(self, at: Any, child: Node, after: Any) -> tuple[Any, Any]:
        """The state to keep for `after`, and its key (default: itself, twice); `at` is where the
        step ran from (None for the initial state)."""
        return after, after

    def observe(self, attempt: Attempt) -> CheckFailure | None:
        """The explorer's own checks on a step, after the shared ones."""
        return None

    def live(self, at: Any, state: Any) -> CheckFailure | None:
        """Liveness from a state (default: none)."""
        return None

    def progress(self, expanded: int) -> None:
        """Called every two seconds of search (silent by default)."""
        return None

    # -- on many workers (`kvsched.proofs.distributed`) ------------------------------------------

    def shipped(self, index: int) -> Any:
        """What a worker needs to position state `index` (default: its path from the start)."""
        return tuple(self.path(index))

    def arrive(self, shipped: Any, memo: dict[Any, tuple[Any, Any]]) -> tuple[Any, Any, Any]:
        """At a worker, where state `shipped` is: what running events from it needs, the state
        in its systems' names, and the state as kept. Default: its path replayed from the start
        (each step as `attempt` runs it; the systems the single process keeps for a state are the
        ones its first path reached, so the same), the nodes of the path's proper prefixes (its
        ancestors) kept in `memo` for the level's next states."""
        path: tuple[Any, ...] = shipped
        done = next((length for length in range(len(path) - 1, 0, -1) if path[:length] in memo), 0)
        if done:
            at, kept = memo[path[:done]]
        else:
            at = self.start()
            kept, _ = self.kept(None, at, self.initial(at))
        for length in range(done + 1, len(path) + 1):
            attempt = self.attempt(at, kept, path[length - 1])
            self.replayed(attempt)
            kept, _ = self.kept(at, attempt.child, attempt.after)
            at = attempt.child
            if length < len(path):
                memo[path[:length]] = at, kept
        return at, kept, kept

    def replayed(self, attempt: Attempt) -> None:
        """A step of a replayed path ran: leave its child's systems as the single process left
        them, which also ran `observe` on it (default: `observe` changes no system)."""
        return None

    def remember(self, shipped: Any, at: Any, kept: Any, memo: dict[Any, tuple[Any, Any]]) -> None:
        """At a worker about to expand state `shipped`: keep where it is in `memo`, which its
        children's replays at the next level start from (default: by its path)."""
        memo[shipped] = at, kept

    def sent(self, kept: Any, key: Any) -> Any:
        """What a worker sends back for a new successor (default: its key, which the coordinator
        keeps as the state: it ships paths, never states)."""
        return key

    def received(self, sent: Any) -> tuple[Any, Any]:
        """At the coordinator: a successor a worker sent, as the state to keep and its key
        (default: no state, the key sent: the coordinator ships paths)."""
        return None, sent

    def owned(self, sent: Any) -> tuple[Any, Any]:
        """At a coordinator whose seen-set is in parts: a successor as the state to keep and the
        key its owner keeps, which must mean the same in every process and every run (default:
        `received`'s key, a value)."""
        return self.received(sent)

    def tally(self) -> tuple[int, ...]:
        """The explorer's own counts of what its steps saw (default: none); a worker sends each
        state's share, and the coordinator adds them up (`add_tally`)."""
        return ()

    def add_tally(self, counts: tuple[int, ...]) -> None:
        """Add a worker's counts (`tally`) to this explorer's."""
        return None

    # -- the search ----------------------------------------------------------------------------

    def path(self, index: int) -> list[Any]:
        """The events (as kept) from the initial state to state `index`."""
        events: list[Any] = []
        while index > 0:
            events.append(self.via[index])
            index = self.parent[index]
        return events[::-1]

    def _add(self, state: Any, key: Any, parent: int, event: Any) -> bool:
        if key in self.index:
            return False
        self.index[key] = len(self.states)
        self._append(state, parent, event)
        return True

    def _append(self, state: Any, parent: int, event: Any) -> None:
        """Number a new state (its key kept by the caller)."""
        self.states.append(state)
        self.parent.append(parent)
        self.via.append(event)
        self.depth.append(0 if parent < 0 else self.depth[parent] + 1)

    def _check_state(self, state: Any) -> CheckFailure | None:
        self.searched.checks += len(self.component.invariants)
        return self.check_state(state)

    def _fail(self, failure: CheckFailure, event: Any | None, index: int) -> Searched:
        self.searched.violation = Violation(failure.kind, failure.detail, self.path(index), event)
        return self._finish()

    def _finish(self) -> Searched:
        self.searched.states = len(self.states)
        self.searched.depth = max(self.depth, default=0)
        self.searched.seconds = time.perf_counter() - self._started
        return self.searched

    def tried(self, at: Any, state: Any, event: Any) -> tuple[Attempt, CheckFailure | None]:
        """Run `event` from a positioned state, and check the step: the shared checks (the
        states' invariants aside: checked once per state found), then the explorer's own."""
        attempt = self.attempt(at, state, event)
        failure = check_step(
            state,
            attempt.event,
            attempt.outcome,
            attempt.after,
            attempt.reference,
            component=self.component,
            config=self.config,
            invariants=False,
        )
        return attempt, failure or self.observe(attempt)

    def check_state(self, state: Any) -> CheckFailure | None:
        """Every invariant of the component on `state`."""
        return check_state(state, self.component)

    def _expand(self, index: int, node: Node, frontier: deque[Node]) -> tuple[CheckFailure, Any] | None:
        """Run every event from state `index`; the first failure and its event, if any."""
        at, state = self.position(index, node)
        limit = self.max_depth
        events = [] if limit is not None and self.depth[index] >= limit else self.events(at, state)
        searched = self.searched
        for event in events:
            attempt, failure = self.tried(at, state, event)
            searched.transitions += 1
            searched.checks += 1
            if failure:
                return failure, event
            if attempt.outcome.error is not None:
                continue
            kept, key = self.kept(at, attempt.child, attempt.after)
            if self._add(kept, key, index, event):
                frontier.append(attempt.child)
                if failure := self._check_state(attempt.after):
                    return failure, event
        searched.checks += 1
        if failure := self.live(at, state):
            return failure, None
        return None

    def search(self, max_states: int | None = None) -> Searched:
        """Search until every reachable state is checked, a check fails, or `max_states` are found
        (checked after each state's events: the states found are the same on every machine)."""
        self._started = last = time.perf_counter()
        first = self.start()
        initial = self.initial(first)
        kept, key = self.kept(None, first, initial)
        self._add(kept, key, -1, None)
        if failure := self._check_state(initial):
            return self._fail(failure, None, 0)
        frontier = deque([first])
        expanded = 0
        while frontier:
            if found := self._expand(expanded, frontier.popleft(), frontier):
                return self._fail(*found, expanded)
            expanded += 1
            now = time.perf_counter()
            if now - last > 2.0:
                last = now
                self.progress(expanded)
            if max_states is not None and len(self.states) >= max_states:
                return self._finish()
        self.searched.complete = True
        return self._finish()
