"""What a checked component is: a state value, an alphabet of events, invariants and step checks.

A `Component` is registered once (`kvsched.testing.registry`) and every harness runs over it:
the step checker (`kvsched.testing.checks.check_step`) asks it for its invariants and its own
step checks, the machine base (`kvsched.testing.component_machine`) draws its events, the
explorer (`kvsched.proofs.component_explorer`) enumerates them, and the bug catalogue names
its broken variants. Each event of its alphabet is an `EventSpec`: which harness drives it, the
z3 transition that models it, and, for each harness that does not, why (`gaps`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvsched.testing.outcome import CheckFailure, Outcome


class Harness(Enum):
    """The harnesses that drive events."""

    MACHINE = "machine"  # a hypothesis stateful machine (lockstep with the spec)
    EXPLORER = "explorer"  # exhaustive search of every state within bounds
    Z3 = "z3"  # an inductive proof over a z3 transition
    CONTRACTS = "contracts"  # CrossHair contracts and the pair programs
    SAFETY = "safety"  # safety mode, over a foreign page manager's adapter


@dataclass(frozen=True, slots=True)
class StepContext:
    """One checked step as a component's own check sees it: the states before and after, the
    event, its outcome, the harness's configuration for the component (the page size of the
    system's rounds, an engine's `EngineConfig`), and whether the program keeps the ownership
    model (an abusing program gets lockstep and atomicity only)."""

    before: Any
    event: Any
    outcome: Outcome
    after: Any
    config: Any = None
    ownership: bool = True


StepCheck = Callable[[StepContext], CheckFailure | None]
QUERY = "a query: it changes no state"  # why a state-space harness skips a read-only event


def _name(entry: Any) -> str:
    return str(entry.__name__ if isinstance(entry, type) else entry.name)


@dataclass(frozen=True, slots=True)
class Corpus:
    """A corpus of deliberately broken variants: the bug catalogue's field that names its
    entries, and where they are (`module:ATTRIBUTE`, read only when listed: a mapping, whose
    keys name them; names; entries with a `name`; classes; or a function returning any of these)."""

    field: str
    where: str

    def names(self) -> list[str]:
        """Every entry's name."""
        module_name, attribute = self.where.split(":")
        found: Any = getattr(importlib.import_module(module_name), attribute)
        if callable(found) and not isinstance(found, type):
            found = found()
        if isinstance(found, Mapping):
            return [str(key) for key in found]
        return [entry if isinstance(entry, str) else _name(entry) for entry in found]


Invariant = Callable[[Any], bool]


@dataclass(frozen=True)
class EventSpec:
    """One event of a component's alphabet.

    `ids`: the fields naming requests or pages (what a symmetry reduction renames); `z3`: the
    transitions that model it, each `module:name` of `kvsched.proofs` (`conformance:Event` is
    the system encoding's branch for the event); `gaps`: for each harness
    that does not drive it, why; `read_only`: a query, whose call must change nothing; `draw`:
    given a machine, a hypothesis strategy of such events (valid and invalid); `explore`: given a
    state and the explorer's configuration, every such event the explorer tries there."""

    event: type[Any]
    ids: tuple[str, ...] = ()
    z3: tuple[str, ...] = ()
    gaps: Mapping[Harness, str] = field(default_factory=dict)
    read_only: bool = False
    draw: Callable[[Any], Any] | None = None
    explore: Callable[[Any, Any], Iterable[Any]] | None = None

    @property
    def name(self) -> str:
        """The event's class name."""
        return self.event.__name__


@dataclass(frozen=True)
class Component:
    """A checked component, registered once.

    `state`: the type of its state value; `spec(config)`: a fresh spec object system;
    `abstraction(system)`: the state value an object system (spec, impl or a user's) stands for;
    `invariants`: predicates every reachable state satisfies (reported by name), unless
    `violations` says more (a list of what is wrong, empty when nothing is); `checks`: its own
    step checks, run after atomicity and before the invariants; `drain(state)`: the events that
    must give everything back from `state` (liveness), and `drained(state)` says they did;
    `corpora`: its corpora of broken variants, each listed in the bug catalogue; `gaps`: for
    each harness that drives none of its events, why; `impl(config)`: impl's object system, if
    impl implements the component; `explored`: per proof profile ("ci", "deep"), the
    configurations `python -m kvsched.proofs.component_explorer` searches exhaustively."""

    name: str
    summary: str
    state: type[Any]
    events: tuple[EventSpec, ...]
    invariants: tuple[Invariant, ...]
    abstraction: Callable[[Any], Any]
    spec: Callable[[Any], Any] | None = None
    checks: tuple[StepCheck, ...] = ()
    violations: Callable[[Any], list[str]] | None = None
    drain: Callable[[Any], list[Any]] | None = None
    drained: Callable[[Any], bool] | None = None
    corpora: tuple[Corpus, ...] = ()
    gaps: Mapping[Harness, str] = field(default_factory=dict)
    impl: Callable[[Any], Any] | None = None
    explored: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def broken(self, state: Any) -> list[str]:
        """What is wrong with `state`: the invariants it breaks (by name), or `violations`."""
        if self.violations is not None:
            return self.violations(state)
        return [invariant.__name__ for invariant in self.invariants if not invariant(state)]

    def event_spec(self, event: object) -> EventSpec:
        """The entry of `event`'s type."""
        for entry in self.events:
            if type(event) is entry.event:
                return entry
        raise KeyError(f"{type(event).__name__} is not an event of component {self.name!r}")

    def gap(self, entry: EventSpec, harness: Harness) -> str | None:
        """Why `harness` does not drive `entry`'s event (None: no reason is given)."""
        return entry.gaps.get(harness) or self.gaps.get(harness)

    def event_types(self) -> tuple[type[Any], ...]:
        """The types of its events, in registration order."""
        return tuple(entry.event for entry in self.events)
