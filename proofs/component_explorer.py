"""Exhaustive bounded search over any registered component, by its registration alone.

`ComponentExplorer` is the shared breadth-first search (`kvsched.proofs.search.Search`) with a
registered component's defaults: from a fresh system (and a reference beside it, when given),
every event its entries' `explore` ranges list runs on a copy of the systems, checked by
`check_step` with the component's own checks; liveness is its `drain`. States must be hashable.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvsched.proofs.search import Node, Search, Searched, run_event
from kvsched.report import print_table
from kvsched.testing.component import Component
from kvsched.testing.outcome import CheckFailure, FailureKind
from kvsched.testing.registry import COMPONENTS

Factory = Callable[[Any], Any]


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
        return Node(self.factory(self.config), self.reference(self.config) if self.reference else None)

    def live(self, at: Any, state: Any) -> CheckFailure | None:
        drain, drained = self.component.drain, self.component.drained
        if drain is None or drained is None:
            return None
        system = copy.deepcopy(at.sut)
        for event in drain(state):
            outcome = run_event(system, event)
            if outcome.error is not None:
                return CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}: {outcome.summary()}")
        state = self.component.abstraction(system)
        return None if drained(state) else CheckFailure(FailureKind.LIVENESS, f"not everything came back: {state}")

    def progress(self, expanded: int) -> None:
        if self.report is not None:
            transitions = self.searched.transitions
            self.report(f"  {self.component.name}: {len(self.states):,} states, {transitions:,} transitions")

    def run(self, max_states: int = 100_000) -> Searched:
        """Search until every reachable state is checked or `max_states` are found."""
        return self.search(max_states)


@dataclass(frozen=True, slots=True)
class ComponentRecipe:
    """How a worker builds a component explorer (`kvsched.proofs.distributed`): the registered
    component by name, a configuration it explores, and whether impl runs in lockstep with the
    spec (else the spec alone)."""

    component: str
    config: Any
    lockstep: bool = True

    def build(self) -> ComponentExplorer:
        component = next((found for found in COMPONENTS if found.name == self.component), None)
        if component is None or component.spec is None:
            raise ValueError(f"no registered component {self.component!r} with a spec")
        if self.lockstep and component.impl is not None:
            return ComponentExplorer(component, self.config, component.impl, component.spec)
        return ComponentExplorer(component, self.config, component.spec)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Every registered component's configurations for the profile; 0 when none is violated."""
    parser = argparse.ArgumentParser(prog="python -m kvsched.proofs.component_explorer", description=__doc__)
    parser.add_argument("--deep", action="store_true", help="the deep profile's configurations")
    parser.add_argument("--workers", type=int, default=0, help="search on N worker processes (the same states)")
    parser.add_argument("--ray", metavar="ADDRESS", help="search on a Ray cluster (auto, local, or an address)")
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error("--workers takes 1 or more")
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
            if args.workers or args.ray:
                from kvsched.proofs.distributed import DistributedSearch, report_level

                workers = max(args.workers, 1)
                recipe = ComponentRecipe(component.name, config)
                search = DistributedSearch(recipe, workers, args.ray, report=report_level, partitions=workers)
                result = search.run(100_000)
            else:
                subject, reference = (impl, spec) if impl is not None else (spec, None)
                result = ComponentExplorer(component, config, subject, reference, _log).run()
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
