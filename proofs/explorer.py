"""Exhaustive bounded model checking of the pool, store and scheduler (the spec objects, impl, or
any system under test).

The shared breadth-first search (search.py) over every state reachable within `Bounds`, running
the system's own code for every event of the alphabet (operations.py) in every state. Each step
is checked by `kvsched.testing.checks.check_step`, the checker the stateful machine uses (typed
errors, lockstep with a `reference`, atomicity, LIFO reuse, exclusive writes), and every new
state by every invariant; liveness: from every state, finishing every live request, removing
every prefix entry and releasing the producer's holds gives every page back (nothing leaks).
What this explorer adds to the search: states are kept canonical (canon.py) under their interned
parts; a system made of spec objects is loaded with the kept state, any other is replayed along
the path and copied; the producer's holds are carried beside the system. The first violation
found has a shortest trace; trace.py prints it as a runnable program.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.proofs.canon import Canonicalizer, Renaming
from kvsched.proofs.operations import Bounds, alphabet, rename, static_alphabet, within_budget
from kvsched.proofs.search import Attempt, Node, Search, Searched, Violation
from kvsched.proofs.subject import SPEC, Positioner, Subject, snapshot
from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.invariants import INVARIANTS, post_drained_all_free
from kvsched.spec.slots import is_live
from kvsched.spec.step import apply, holds_after
from kvsched.spec.system import SystemState
from kvsched.testing.backends import backend_for
from kvsched.testing.checks import CheckFailure, FailureKind, Outcome, capture
from kvsched.testing.registry import SYSTEM

__all__ = ["Exploration", "Explorer", "Violation", "attempt", "drain", "explore"]


@dataclass(kw_only=True)
class Exploration(Searched):
    """One run of the explorer: what it covered and what it found."""

    subject: str
    reference: str | None
    bounds: Bounds
    invariants: tuple[str, ...] = field(default_factory=lambda: tuple(inv.__name__ for inv in INVARIANTS))

    @property
    def states_per_second(self) -> float:
        """Distinct states discovered per second of search."""
        return self.states / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class At:
    """Where the systems are put for one kept state: the kept (canonical) state, the same state
    in the systems' own names, and the map from canonical names to theirs (None: the same)."""

    kept: SystemState
    state: SystemState
    back: Renaming | None


ANY = Node()  # what a queued state keeps beside itself: nothing (its systems are loaded or replayed)


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


class Explorer(Search):
    """Breadth-first search over the canonical states of one subject."""

    def __init__(
        self,
        bounds: Bounds,
        subject: Subject = SPEC,
        reference: Subject | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(SYSTEM, bounds.page_size)
        self.bounds, self.subject, self.max_depth = bounds, subject, bounds.max_depth
        self.canon = Canonicalizer(bounds)
        self.positioner = Positioner(subject, bounds.config())
        self.reference = Positioner(reference, bounds.config()) if reference is not None else None
        self.static = static_alphabet(bounds)
        if not hasattr(self.positioner.fresh(), "overlapping_scratch"):  # an optional capability
            self.static = tuple(event for event in self.static if not isinstance(event, ev.DecodeOverlapping))
        self.report = progress
        self.result = Exploration(subject=subject.name, reference=reference.name if reference else None, bounds=bounds)
        self.searched = self.result

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

    # -- the search's hooks ------------------------------------------------------------------------

    def start(self) -> Node:
        return Node(self.positioner.fresh())

    def position(self, index: int, node: Node) -> tuple[At, SystemState]:
        """A loadable system is put in the canonical state itself (no renaming); any other is
        replayed along the path, in whatever names that produces."""
        return self._reach(self.states[index], self.path(index))

    def loaded(self, kept: SystemState) -> tuple[At, SystemState]:
        """Where a loadable system is put for the kept state `kept`: in it, no renaming."""
        return At(kept, kept, None), kept

    def events(self, at: At, state: SystemState) -> list[Any]:
        """The canonical operations to try (none past a budget)."""
        if not within_budget(at.kept, self.bounds):
            return []
        return alphabet(at.kept, self.bounds, self.static)

    def attempt(self, at: At, state: SystemState, event: Any) -> Attempt:
        back = at.back
        real = event if back is None else rename(event, back.ids, back.identities, back.pages)
        lockstep = self.reference is not None
        outcome, after = attempt(real, self.positioner.at(state), state, self.bounds, lockstep)
        reference = None if self.reference is None else attempt(real, self.reference.at(state), state, self.bounds)
        return Attempt(real, outcome, after, reference, ANY)

    def kept(self, at: At | None, child: Node, after: Any) -> tuple[Any, Any]:
        """`after` in canonical names (as like the loaded state as the class allows), keyed by its
        interned parts; `at` is None for the initial state."""
        like = at.state if at is not None and at.back is None else None
        canonical, _ = self.canon.canonical(after, like)
        return canonical, self.canon.key(canonical)

    def live(self, at: At, state: SystemState) -> CheckFailure | None:
        sut = self.positioner.at(state)
        current = state
        for event in drain(state, self.canon.index_of):
            outcome, current = attempt(event, sut, current, self.bounds)
            if outcome.error is not None:
                return CheckFailure(FailureKind.LIVENESS, f"draining failed at {event!r}: {outcome.summary()}")
        if post_drained_all_free(current):
            return None
        return CheckFailure(FailureKind.LIVENESS, f"pages leak after draining: refs={current.pool.refs}")

    # -- on many workers: a kept state is shipped, and loaded or reached along its path ----------

    def interned(self, state: SystemState) -> SystemState:
        """`state` with its parts interned by the canonicalizer (its key is then the identities of
        its parts, as the single process keys it)."""
        canon = self.canon
        return SystemState(
            canon.intern(state.pool),
            canon.intern(state.store),
            canon.intern(state.scheduler),
            canon.intern(state.external),
        )

    def shipped(self, index: int) -> Any:
        """The kept state; and, for a subject that cannot be loaded, its path."""
        return self.states[index] if self.positioner.loadable else (self.states[index], tuple(self.path(index)))

    def arrive(self, shipped: Any, memo: dict[Any, tuple[Any, Any]]) -> tuple[Any, Any, Any]:
        """The kept state loaded, or (a subject that cannot be loaded) reached along its path, as
        `position` reaches it."""
        sent, path = (shipped, ()) if self.positioner.loadable else shipped
        kept = self.interned(sent)  # as the single process keeps it: its parts shared
        at, state = self._reach(kept, list(path))
        return at, state, kept

    def _reach(self, kept: SystemState, path: list[Any]) -> tuple[At, SystemState]:
        """Where the kept state is: loaded, or replayed along `path` (a subject that cannot be
        loaded), in whatever names that produces."""
        if self.positioner.loadable:
            return self.loaded(kept)
        holder: list[tuple[SystemState, Renaming]] = []
        self.positioner.park(lambda sut: holder.append(self.replay(sut, path)))
        state, renaming = holder[0]
        return At(kept, state, renaming.inverse()), state

    def remember(self, shipped: Any, at: Any, kept: Any, memo: dict[Any, tuple[Any, Any]]) -> None:
        return None  # its replays start from a fresh system: nothing to keep

    def sent(self, kept: Any, key: Any) -> Any:
        return kept  # its key names this process's interned parts: the coordinator keys it again

    def received(self, sent: Any) -> tuple[Any, Any]:
        state = self.interned(sent)
        return state, self.canon.key(state)

    def owned(self, sent: Any) -> tuple[Any, Any]:
        return sent, sent  # the canonical state is its own key in any process (none interned here)

    def progress(self, expanded: int) -> None:
        if self.report is not None:
            seconds = time.perf_counter() - self._started
            self.report(
                f"  {self.subject.name}: {len(self.states):,} states ({expanded:,} expanded), "
                f"{self.result.transitions:,} transitions, depth {self.depth[expanded - 1]}, "
                f"{len(self.states) / seconds:,.0f} states/s"
            )

    def run(self, max_states: int | None = None) -> Exploration:
        """Explore until done, a violation or `max_states` states (never a time limit: the states
        explored are the same on every machine)."""
        self.search(max_states)
        return self.result


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
