"""What the explorer runs: a system factory (the stateful harness's boundary) and how to load it.

A `Subject` is a `kvsched.testing.system.SystemFactory` with a name and the Python lines that
bind it as `factory` in a printed counterexample. The spec, its deliberately broken variants
and `kvsched.impl` all plug in through that one boundary, so the same explorer checks each.

The explorer needs a system *at* a given state. Systems built from spec objects are loaded by
committing the frozen states directly (through the spec base classes, so a variant's own
`commit` cannot reinterpret them); such a system must keep all its state in those values.
Any other system (impl, a user's page manager) is brought there by replaying the shortest
path from a fresh system, then copied once per operation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from kvsched.spec.pool import BlockPool
from kvsched.spec.prefix import PrefixKvStore
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.system import SystemState
from kvsched.testing.impl_system import impl_system
from kvsched.testing.system import SystemConfig, SystemFactory, SystemUnderTest, spec_system
from kvsched.testing.variants import VARIANTS


@dataclass(frozen=True)
class Subject:
    """A named system factory, and how a printed program imports it."""

    name: str
    factory: SystemFactory
    imports: str
    expression: str

    def setup(self, binding: str) -> str:
        """Python lines that bind the factory to `binding` (a comment when it cannot be imported)."""
        if not self.expression:
            return f"# {binding}: {self.name}, not importable; bind it before running this program"
        return f"{self.imports}\n{binding} = {self.expression}"


SPEC = Subject("spec", spec_system, "from kvsched.testing.system import spec_system", "spec_system")
IMPL = Subject("impl", impl_system, "from kvsched.testing.impl_system import impl_system", "impl_system")


def variant(name: str) -> Subject:
    """A deliberately broken spec variant of the stateful harness (`kvsched.testing.variants`)."""
    return Subject(
        f"spec variant: {name}", VARIANTS[name], "from kvsched.testing.variants import VARIANTS", f"VARIANTS[{name!r}]"
    )


def snapshot(sut: SystemUnderTest, external: tuple[int, ...]) -> SystemState:
    """The whole system as one spec value, with the explorer's own external holds."""
    pool, store, scheduler = sut.snapshot()
    return SystemState(pool, store, scheduler, external)


def is_loadable(sut: SystemUnderTest) -> bool:
    """The system is made of spec objects, whose states can be committed directly."""
    return (
        isinstance(sut.pool, BlockPool)
        and isinstance(sut.store, PrefixKvStore)
        and isinstance(sut.scheduler, RequestScheduler)
    )


def load(sut: SystemUnderTest, state: SystemState) -> None:
    """Put a spec-object system into `state` (the base classes' commit: no variant logic)."""
    BlockPool.commit(sut.pool, state.pool)
    PrefixKvStore.commit(sut.store, state.store)
    RequestScheduler.commit(sut.scheduler, state.scheduler)


class Positioner:
    """Hands out systems positioned at a state: loaded when possible, else replayed and copied."""

    def __init__(self, subject: Subject, config: SystemConfig) -> None:
        self.subject = subject
        self.config = config
        self._shared = subject.factory(config)
        self.loadable = is_loadable(self._shared)
        self._parked: SystemUnderTest | None = None

    def fresh(self) -> SystemUnderTest:
        """A new system in its initial state."""
        return self.subject.factory(self.config)

    def park(self, replay: Callable[[SystemUnderTest], None]) -> None:
        """For a system that cannot be loaded: replay a path into a fresh system, keep it."""
        if not self.loadable:
            parked = self.fresh()
            replay(parked)
            self._parked = parked

    def at(self, state: SystemState) -> SystemUnderTest:
        """A system in `state`: the shared one loaded, or a copy of the parked replay."""
        if self.loadable:
            load(self._shared, state)
            return self._shared
        assert self._parked is not None, "park() a replayed system before asking for copies"
        return copy.deepcopy(self._parked)
