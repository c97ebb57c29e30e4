"""Exhaustive bounded search over any registered component, by its registration alone.

`Search` is the breadth-first search the explorers share: from a fresh system, every event of a
state's alphabet runs on a copy of its systems (the system under test and, when there is one,
the reference beside it); every step is checked by `kvsched.testing.checks.check_step` with the
component's own checks, then by the explorer's own observations; a new state is queued under
its key, and liveness is checked from it when it is taken. The first violation found has a
shortest path. `ComponentExplorer` is the search over any registered component (its entries'
`explore` ranges, its drain); the engine's explorer (`kvsched.proofs.engine_explorer`) is the
same search with its own key, alphabet and checks. States must be hashable.

    python -m kvsched.proofs.component_explorer [--deep]

searches, for every registered component with explorer ranges, impl in lockstep with the spec
on each configuration the component lists for the profile (`Component.explored`), and exits 1
on a violation (printed as its path of events).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvsched.proofs.explorer import Violation
from kvsched.report import print_table
from kvsched.spec.step import apply
from kvsched.testing.checks import check_state, check_step
from kvsched.testing.component import Component
from kvsched.testing.outcome import CheckFailure, FailureKind, Outcome, capture
from kvsched.testing.registry import COMPONENTS

Factory = Callable[[Any], Any]


def _run(system: Any, event: Any) -> Outcome:
    return capture(lambda: apply(system, event))


@dataclass
class Node:
    """One explored state's systems (the system under test and the reference), the events that
    reached it, and what else the explorer keeps of its history (`history`: the engine's
    explorer, which requests were submitted)."""

    sut: Any
    ref: Any | None
    path: list[Any]
    history: Any = None


@dataclass
class Searched:
    """What a search covered, and its first failure with the shortest path to it."""

    states: int = 0
    transitions: int = 0
    depth: int = 0
    complete: bool = False
    failure: CheckFailure | None = None
    path: list[Any] = field(default_factory=list)
    event: Any | None = None  # the event that failed (None: a state's check)


class Search(ABC):
    """The breadth-first search every explorer of a registered component shares.

    From `start()`, each state's `events` run on a copy of its systems, checked by `check_step`
    with the component's own checks and then by `observe`; a new state (by `key`) is queued, and
    when it is taken from the queue, `live` checks liveness from it. Subclasses say what a state's
    key, alphabet, history and extra checks are; the defaults are a registered component's."""

    def __init__(self, component: Component, config: Any) -> None:
        self.component, self.config = component, config
        self.states: list[Any] = []  # every state found, in the order found

    # -- hooks ---------------------------------------------------------------------------------

    @abstractmethod
    def start(self) -> Node:
        """The initial state's systems."""

    def key(self, node: Node, state: Any) -> Any:
        return state

    def events(self, node: Node, state: Any) -> list[Any]:
        ranges = [entry.explore for entry in self.component.events if entry.explore is not None]
        return [event for explore in ranges for event in explore(state, self.config)]

    def history(self, node: Node, event: Any) -> Any:
        return node.history

    def observe(self, node: Node, system: Any, event: Any, outcome: Outcome, after: Any) -> CheckFailure | None:
        return None

    def live(self, node: Node) -> CheckFailure | None:
        return None

    def progress(self, searched: Searched) -> None:
        """Called as each 10,000th state is found (silent by default)."""
        return None

    # -- the search ----------------------------------------------------------------------------

    def search(self, max_states: int) -> Searched:
        """Search until every reachable state is checked, a check fails, or `max_states` are found."""
        component, searched = self.component, Searched()
        first = self.start()
        initial = component.abstraction(first.sut)
        seen = {self.key(first, initial)}
        self.states.append(initial)
        if failure := check_state(initial, component):
            return replace(searched, failure=failure, states=1)
        frontier = deque([first])
        while frontier:
            node = frontier.popleft()
            searched.states += 1
            if failure := self.live(node):
                searched.failure, searched.path = failure, node.path
                return searched
            state = component.abstraction(node.sut)
            for event in self.events(node, state):
                searched.transitions += 1
                mine, theirs = copy.deepcopy(node.sut), copy.deepcopy(node.ref)
                outcome = _run(mine, event)
                after = component.abstraction(mine)
                reference = None
                if theirs is not None:
                    reference = _run(theirs, event), component.abstraction(theirs)
                failure = check_step(state, event, outcome, after, reference, component=component, config=self.config)
                failure = failure or self.observe(node, mine, event, outcome, after)
                if failure is not None:
                    searched.failure, searched.path, searched.event = failure, [*node.path, event], event
                    return searched
                child = Node(mine, theirs, [*node.path, event], self.history(node, event))
                key = self.key(child, after)
                if outcome.error is not None or key in seen:
                    continue
                if len(seen) >= max_states:
                    return searched
                seen.add(key)
                self.states.append(after)
                searched.depth = max(searched.depth, len(child.path))
                if len(seen) % 10_000 == 0:
                    self.progress(searched)
                frontier.append(child)
        searched.complete = True
        return searched


@dataclass
class ComponentExploration:
    """One search: what it covered and what it found."""

    component: str
    states: int = 0
    transitions: int = 0
    depth: int = 0
    complete: bool = False
    violation: Violation | None = None


class ComponentExplorer(Search):
    """Any registered component's states, by its registration alone: its entries' `explore`
    ranges, and liveness by its `drain`."""

    def __init__(
        self,
        component: Component,
        config: Any,
        factory: Factory,
        reference: Factory | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if not any(entry.explore is not None for entry in component.events):
            raise ValueError(f"component {component.name!r} registers no event the explorer can enumerate")
        super().__init__(component, config)
        self.factory, self.reference, self.report = factory, reference, progress

    def start(self) -> Node:
        return Node(self.factory(self.config), self.reference(self.config) if self.reference else None, [])

    def live(self, node: Node) -> CheckFailure | None:
        drain, drained = self.component.drain, self.component.drained
        if drain is None or drained is None:
            return None
        system = copy.deepcopy(node.sut)
        for event in drain(self.component.abstraction(system)):
            outcome = _run(system, event)
            if outcome.error is not None:
                return CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}: {outcome.summary()}")
        state = self.component.abstraction(system)
        return None if drained(state) else CheckFailure(FailureKind.LIVENESS, f"not everything came back: {state}")

    def progress(self, searched: Searched) -> None:
        if self.report is not None:
            self.report(f"  {self.component.name}: {len(self.states):,} states, {searched.transitions:,} transitions")

    def run(self, max_states: int = 100_000) -> ComponentExploration:
        """Search until every reachable state is checked or `max_states` are found."""
        searched = self.search(max_states)
        result = ComponentExploration(self.component.name, len(self.states), searched.transitions, searched.depth)
        result.complete = searched.complete
        if searched.failure is not None:
            failure = searched.failure
            result.violation = Violation(failure.kind, failure.detail, searched.path, searched.event)
        return result


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Every registered component's configurations for the profile; 0 when none is violated."""
    parser = argparse.ArgumentParser(prog="python -m kvsched.proofs.component_explorer", description=__doc__)
    parser.add_argument("--deep", action="store_true", help="the deep profile's configurations")
    args = parser.parse_args(argv)
    profile = "deep" if args.deep else "ci"
    rows: list[list[object]] = []
    failed = False
    for component in COMPONENTS:
        spec, impl = component.spec, component.impl
        for config in component.explored.get(profile, ()):
            if spec is None:
                raise ValueError(f"component {component.name!r} lists configurations but no spec")
            _log(f"explorer: {component.name} {config} ...")
            start = time.perf_counter()
            subject, reference = (impl, spec) if impl is not None else (spec, None)
            explorer = ComponentExplorer(component, config, subject, reference, _log)
            result = explorer.run()
            seconds = time.perf_counter() - start
            violation = result.violation
            if violation is not None:
                failed = True
                print(f"{violation.kind.value}: {violation.detail}\n" + "\n".join(map(repr, violation.path)))
            against = " ⇄ spec" if impl is not None else ""
            complete = "" if result.complete else " (stopped)"
            outcome = "pass" if violation is None else "FAIL"
            name, states = f"{component.name}{against} {config}", f"{result.states:,}{complete}"
            rows.append([name, states, f"{result.transitions:,}", outcome, f"{seconds:.1f}s"])
    print_table(rows, ["component explorer", "states", "transitions", "outcome", "time"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
