"""Small systems built from plain ints, the `Transition` record contracts return, and their predicates.

CrossHair explores plain `int` arguments symbolically; frozen spec values built from them stay
symbolic. A contract takes a handful of small ints, builds a whole `SystemState` from them with
`make_system` (reference counts are *derived* from the owners, so only the free-stack order and
the sizes are free), runs one transition and returns a `Transition`: the state before, the refusal's
error name (or None), the state after (with the owner bookkeeping the caller does) and the
transition's value. Postconditions then speak about `__return__.before` and `__return__.after`.

    pages 0..2 (PAGES), free stack = the zero-count pages in permutation ORDERS[order]
    extras (e0, e1, e2) = references external holders keep on pages 0, 1, 2
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from kvsched.spec.batch import RaggedDecodeBackend
from kvsched.spec.errors import KvschedError
from kvsched.spec.events import Event
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.invariants import check_invariants
from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import PrefixPageSet, StoreEntry, StoreState
from kvsched.spec.slots import RequestState, SchedulerState, Slot
from kvsched.spec.step import apply
from kvsched.spec.system import SystemState, get_owner_references
from kvsched.spec.table import Table
from kvsched.testing.checks import Outcome, capture

T = TypeVar("T")

PAGES = 3
ORDERS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(PAGES)))
MAX_REFERENCES = 4
WIDTH = 2  # logical pages per request table
STATES = (RequestState.EMPTY, RequestState.PREFILL, RequestState.DECODE)


@dataclass(frozen=True, slots=True)
class Transition(Generic[T]):
    """One transition: the state before, the call's `Outcome` (the harnesses' one outcome type),
    and the state after (equal to `before` when refused)."""

    before: SystemState
    outcome: Outcome
    after: SystemState

    @property
    def ok(self) -> bool:
        """The transition was enabled and ran."""
        return self.outcome.error is None

    @property
    def error(self) -> str | None:
        """The refusal's error class name, or None."""
        return None if self.outcome.error is None else self.outcome.error.__name__

    @property
    def value(self) -> T | None:
        """What the transition returned (None when refused)."""
        value: T | None = self.outcome.value
        return value


def run_step(before: SystemState, transition: Callable[[], tuple[SystemState, T]]) -> Transition[T]:
    """Run `transition`; a `KvschedError` is a refusal, anything else propagates (a bug)."""
    try:
        after, value = transition()
    except KvschedError as error:
        return Transition(before, Outcome(None, type(error)), before)
    return Transition(before, Outcome(value), after)


def play(system: Any, events: Sequence[Event]) -> None:
    """Run a pair program's set-up events, each of which must succeed (a refusal propagates)."""
    for event in events:
        apply(system, event)


def observe(system: Any, event: Event, backend: RaggedDecodeBackend | None = None) -> tuple[Any, ...]:
    """A pair program's observed step: the event's outcome (its value, or its error's type,
    message and details), then the abstract state and the standalone tables after it."""
    outcome = capture(lambda: apply(system, event, backend))
    return (outcome.summary(), system.snapshot(), system.table_states())


def identity(index: int) -> PrefixIdentity:
    """Prefix number `index` (any int; contracts use 0..3)."""
    return PrefixIdentity((index + 1, 0, 0, 0))


def mask_pages(mask: int) -> tuple[int, ...]:
    """The pages whose bit is set in `mask`, ascending."""
    return tuple(page for page in range(PAGES) if mask >> page & 1)


def make_table(*entries: int) -> Table:
    """A table from ints, -1 for an unmapped entry."""
    return tuple(None if entry < 0 else entry for entry in entries)


def make_slot(state: int, request_id: int, table: Table, token_count: int = 0, ready: bool = False) -> Slot:
    """A slot in state code `state` (0 empty, 1 prefill, 2 decode); an empty slot is cleared."""
    if state == 0:
        return Slot((None,) * len(table))
    return Slot(table, request_id, STATES[state], token_count, 0, 0, ready)


def make_entry(ident: int, mask: int, last_used: int) -> StoreEntry | None:
    """A store entry publishing `mask`'s pages under prefix `ident` (None when `ident` < 0)."""
    if ident < 0:
        return None
    pages = mask_pages(mask)
    return StoreEntry(PrefixPageSet(identity(ident), pages, 2 * len(pages) or 1), last_used)


def external(extras: Sequence[int]) -> tuple[int, ...]:
    """One page id per external reference: `extras[p]` references on page `p`."""
    return tuple(page for page, count in enumerate(extras) for _ in range(count))


def make_pool(refs: tuple[int, ...], order: int, max_references: int = MAX_REFERENCES) -> PoolState:
    """A pool with these counts whose free stack holds the zero-count pages in `ORDERS[order]`."""
    return PoolState(refs, tuple(page for page in ORDERS[order] if refs[page] == 0), max_references)


def make_system(
    extras: Sequence[int],
    order: int,
    slots: tuple[Slot, ...] = (Slot((None,) * WIDTH),),
    entries: tuple[StoreEntry | None, ...] = (),
    *,
    max_references: int = MAX_REFERENCES,
    next_victim: int = 0,
    clock: int = 4,
) -> SystemState:
    """A system whose reference counts are exactly its owners' references (tables, store
    entries, external holders); invalid shapes (a page out of range, a count above the
    maximum, a repeated page) make `holds` false."""
    store = StoreState(entries, WIDTH, next_victim, clock)
    owned = SystemState(PoolState((0,) * PAGES, (), max_references), store, SchedulerState(slots), external(extras))
    owners = get_owner_references(owned)
    refs = tuple(owners.get(page, 0) for page in range(PAGES))
    return replace(owned, pool=make_pool(refs, order, max_references))


def holds(state: SystemState) -> bool:
    """Every `inv_*` of `kvsched.spec.invariants` holds."""
    return not check_invariants(state)


def in_range(*values: int, low: int = 0, high: int = PAGES - 1) -> bool:
    """Every value lies in `low..high`.

    One conjunction with `&`, not `all()` or `and`: CrossHair branches on every short-circuit,
    so a guard over n values had some 2n ways to fail, each a whole iteration spent outside the
    domain; a non-short-circuit conjunction is one SMT term and one branch."""
    inside = True
    for value in values:
        inside = inside & (low <= value) & (value <= high)
    return inside


def first(count: int, *values: int) -> tuple[int, ...]:
    """The first `count` values, by one comparison per value: slicing or `range(count)` makes
    CrossHair pin `count` to one concrete value, and it rarely tries another (a pair sliced this
    way never reached a refusal at the second page); comparisons branch on it."""
    return tuple(value for index, value in enumerate(values) if index < count)


def with_external(state: SystemState, add: Sequence[int] = (), drop: Sequence[int] = ()) -> SystemState:
    """`state` with external references added and (one occurrence each) dropped."""
    pages = list(state.external) + list(add)
    for page in drop:
        pages.remove(page)
    return replace(state, external=tuple(sorted(pages)))


def with_slot(state: SystemState, index: int, slot: Slot) -> SystemState:
    """`state` with scheduler slot `index` replaced."""
    slots = state.scheduler.slots
    return replace(state, scheduler=SchedulerState(slots[:index] + (slot,) + slots[index + 1 :]))


def pushed(before: PoolState, after: PoolState) -> tuple[int, ...] | None:
    """The pages pushed on top of the free stack, or None when it changed other than by pushes."""
    if after.free[: len(before.free)] != before.free:
        return None
    return after.free[len(before.free) :]


def popped(before: PoolState, after: PoolState) -> tuple[int, ...] | None:
    """The pages popped off the top of the free stack (top last), or None when it changed other
    than by pops."""
    return pushed(after, before)
