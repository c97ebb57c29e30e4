"""Exhaustive bounded search over any registered component, by its registration alone.

Breadth-first from a fresh system, every event its entries' `explore` ranges yield in each state,
run on the system under test (positioned by replaying the shortest path, then copied once per
event) and, when there is one, on the reference beside it; every step is checked by
`kvsched.testing.checks.check_step` with the component's own checks, every new state by its
invariants, and from every new state liveness (the component's drain gives everything back).
States are the component's state values, which must be hashable. The first violation found
has a shortest path.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
class ComponentExploration:
    """One search: what it covered and what it found."""

    component: str
    states: int = 0
    transitions: int = 0
    depth: int = 0
    complete: bool = False
    violation: Violation | None = None


class ComponentExplorer:
    """Breadth-first search over one component's states, within `max_states`."""

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
        self.component, self.config = component, config
        self.factory, self.reference, self.progress = factory, reference, progress
        self.states: list[Any] = []
        self.index: dict[Any, int] = {}
        self.parent: list[int] = []
        self.via: list[Any] = []
        self.result = ComponentExploration(component.name)

    def path(self, index: int) -> list[Any]:
        """The events from the initial state to state `index`."""
        events: list[Any] = []
        while index > 0:
            events.append(self.via[index])
            index = self.parent[index]
        return events[::-1]

    def _replayed(self, factory: Factory, index: int) -> Any:
        system = factory(self.config)
        for event in self.path(index):
            apply(system, event)
        return system

    def _violation(self, failure: CheckFailure, index: int, event: Any | None) -> ComponentExploration:
        path = self.path(index) + ([event] if event is not None else [])
        self.result.violation = Violation(failure.kind, failure.detail, path, event)
        self.result.states = len(self.states)
        return self.result

    def _add(self, state: Any, parent: int, event: Any) -> int:
        self.index[state] = len(self.states)
        self.states.append(state)
        self.parent.append(parent)
        self.via.append(event)
        return len(self.states) - 1

    def _liveness(self, system: Any) -> CheckFailure | None:
        drain, drained = self.component.drain, self.component.drained
        if drain is None or drained is None:
            return None
        for event in drain(self.component.abstraction(system)):
            outcome = _run(system, event)
            if outcome.error is not None:
                return CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}: {outcome.summary()}")
        state = self.component.abstraction(system)
        return None if drained(state) else CheckFailure(FailureKind.LIVENESS, f"not everything came back: {state}")

    def run(self, max_states: int = 100_000) -> ComponentExploration:
        """Search until every reachable state is checked or `max_states` are found."""
        component, result = self.component, self.result
        initial = component.abstraction(self.factory(self.config))
        self._add(initial, -1, None)
        if failure := check_state(initial, component):
            return self._violation(failure, 0, None)
        depths, frontier = [0], deque([0])
        while frontier:
            index = frontier.popleft()
            state = self.states[index]
            parked = self._replayed(self.factory, index)
            parked_ref = self._replayed(self.reference, index) if self.reference is not None else None
            for entry in component.events:
                for event in entry.explore(state, self.config) if entry.explore is not None else ():
                    sut = copy.deepcopy(parked)
                    outcome = _run(sut, event)
                    after = component.abstraction(sut)
                    reference = None
                    if parked_ref is not None:
                        ref = copy.deepcopy(parked_ref)
                        expected = _run(ref, event)
                        reference = expected, component.abstraction(ref)
                    result.transitions += 1
                    failure = check_step(
                        state, event, outcome, after, reference, component=component, config=self.config
                    )
                    if failure is not None:
                        return self._violation(failure, index, event)
                    if after in self.index:
                        continue
                    if len(self.states) >= max_states:
                        result.states = len(self.states)
                        return result
                    new = self._add(after, index, event)
                    if self.progress is not None and new % 10_000 == 0:
                        self.progress(f"  {component.name}: {new:,} states, {result.transitions:,} transitions")
                    depths.append(depths[index] + 1)
                    result.depth = max(result.depth, depths[new])
                    if failure := self._liveness(copy.deepcopy(sut)):
                        return self._violation(failure, new, None)
                    frontier.append(new)
        result.states, result.complete = len(self.states), True
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
