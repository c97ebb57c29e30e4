"""The z3 conjuncts say what the spec's `inv_*` say, on reachable and on deliberately broken states.

The reachable states are the first `STATES` of a breadth-first exploration (a count, so every
machine checks the same states). Each corruption perturbs reachable states so that chosen
invariants fail (between them, every carried one), staying inside the domains the spec's types
give their fields (sizes, u32 token counts, u64 ids, a page set's distinct pages and 1..2**32-1
tokens): the conjuncts also state those domains, which the types enforce and the invariants do
not repeat.

The ghost parts of the model need no special case: `encode` computes the inverses, `held` and the
owner counters from the concrete fields of any state, broken or not, so every conjunct is compared
as it is, and the counting facts the proofs assume of a pre-state must hold of every encoding
(`COUNTING`, checked with the model-level conjuncts). Where a conjunct asks more than its
invariant, on states that break another invariant, `agreement.LEANS_ON` says so, and a test here
shows each such exception is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

import pytest
import z3

from kvsched.proofs import agreement, invariant
from kvsched.proofs.agreement import COUNTING, Evaluator, carried, disagreements
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.invariant import CONJUNCTS, Conjunct
from kvsched.proofs.model import NONE, Sys, between, bound, in_pages
from kvsched.proofs.operations import Bounds
from kvsched.spec import RequestState
from kvsched.spec.invariants import INVARIANTS, check_invariants, inv_cache_well_formed, inv_tables_fixed_capacity
from kvsched.spec.system import SystemState

BOUNDS = Bounds(requests=2, pages=3, logical_pages=2, entries=2, entry_pages=2, max_references=2, max_external=1)
STATES = 800  # reaches two store entries, two-page entries, shared pages and external holds
PER_CORRUPTION = 6  # reachable states each corruption is applied to, spread over the exploration
CHECKED = (*CONJUNCTS, COUNTING)

BY_CONSTRUCTION = {
    inv_tables_fixed_capacity: "the model has one `width` for every table, so a ragged table has no encoding",
    inv_cache_well_formed: "the system model has no automatic cache (kvsched.proofs.cache_conservation has its own)",
}

Corruption = Callable[[SystemState], SystemState | None]


def _pool(state: SystemState, **changes: Any) -> SystemState:
    return replace(state, pool=replace(state.pool, **changes))


def _count(state: SystemState, page: int, delta: int) -> SystemState:
    refs = list(state.pool.refs)
    refs[page] += delta
    return _pool(state, refs=tuple(refs))


def _slot(system: SystemState, index: int, **changes: Any) -> SystemState:
    slots = list(system.scheduler.slots)
    slots[index] = replace(slots[index], **changes)
    return replace(system, scheduler=replace(system.scheduler, slots=tuple(slots)))


def _entries(state: SystemState) -> list[int]:
    return [index for index, entry in enumerate(state.store.entries) if entry is not None]


def _entry(state: SystemState, index: int, **changes: Any) -> SystemState:
    entries = list(state.store.entries)
    entry = entries[index]
    assert entry is not None
    entries[index] = replace(entry, **changes)
    return replace(state, store=replace(state.store, entries=tuple(entries)))


def _live(state: SystemState) -> list[int]:
    return [index for index, slot in enumerate(state.scheduler.slots) if slot.state is not RequestState.EMPTY]


def _held(state: SystemState, below: int | None = None) -> list[int]:
    limit = state.pool.max_references if below is None else below
    return [page for page, count in enumerate(state.pool.refs) if 0 < count < limit]


def count_too_high(state: SystemState) -> SystemState | None:
    pages = _held(state)
    return _count(state, pages[0], 1) if pages else None


def count_too_low(state: SystemState) -> SystemState | None:
    pages = [page for page, count in enumerate(state.pool.refs) if count >= 2]
    return _count(state, pages[0], -1) if pages else None


def count_below_zero(state: SystemState) -> SystemState | None:  # a free page released once more
    return _count(state, state.pool.free[-1], -1) if state.pool.free else None


def count_below_zero_off_the_stack(state: SystemState) -> SystemState | None:  # see `LEANS_ON`
    free = state.pool.free
    return _pool(_count(state, free[-1], -1), free=free[:-1]) if free else None


def count_past_maximum(state: SystemState) -> SystemState | None:  # owners past max_references
    top = max(state.pool.refs, default=0)
    return _pool(state, max_references=top - 1) if top >= 2 else None


def free_page_pushed_twice(state: SystemState) -> SystemState | None:
    return _pool(state, free=(*state.pool.free, state.pool.free[0])) if state.pool.free else None


def held_page_pushed(state: SystemState) -> SystemState | None:
    pages = _held(state, state.pool.max_references + 1)
    return _pool(state, free=(*state.pool.free, pages[0])) if pages else None


def free_page_lost(state: SystemState) -> SystemState | None:
    return _pool(state, free=state.pool.free[:-1]) if state.pool.free else None


def _unmapped(state: SystemState) -> tuple[int, int] | None:
    """A live slot with a mapped and an unmapped logical page: (slot, unmapped logical page)."""
    for index in _live(state):
        table = state.scheduler.slots[index].table
        if None in table and any(page is not None for page in table):
            return index, table.index(None)
    return None


def table_maps_page_twice(state: SystemState) -> SystemState | None:
    place = _unmapped(state)
    if place is None:
        return None
    index, logical = place
    page = next(page for page in state.scheduler.slots[index].table if page is not None)
    if state.pool.refs[page] >= state.pool.max_references:
        return None
    table = list(state.scheduler.slots[index].table)
    table[logical] = page
    return _count(_slot(state, index, table=tuple(table)), page, 1)  # counted: only the duplicate is wrong


def _map(state: SystemState, page: int, delta: int) -> SystemState | None:
    """`page` mapped at an unmapped logical page of a live slot, its count changed by `delta`."""
    place = _unmapped(state)
    if place is None:
        return None
    index, logical = place
    table = list(state.scheduler.slots[index].table)
    table[logical] = page
    mapped = _slot(state, index, table=tuple(table))
    return _count(mapped, page, delta) if delta else mapped


def table_maps_a_free_page(state: SystemState) -> SystemState | None:  # not counted
    return _map(state, state.pool.free[-1], 0) if state.pool.free else None


def table_maps_a_page_counted_below_zero(state: SystemState) -> SystemState | None:  # see `LEANS_ON`
    return _map(state, state.pool.free[-1], -1) if state.pool.free else None


def table_maps_a_page_past_the_pool(state: SystemState) -> SystemState | None:
    return _map(state, len(state.pool.refs), 0)


def live_slot_marked_empty(state: SystemState) -> SystemState | None:  # emptied, nothing cleared
    slots = state.scheduler.slots
    live = [index for index in _live(state) if slots[index].token_count or slots[index].request_id]
    return _slot(state, live[0], state=RequestState.EMPTY) if live else None


def empty_slot_keeps_a_field(state: SystemState) -> SystemState | None:
    empty = [index for index, slot in enumerate(state.scheduler.slots) if slot.state is RequestState.EMPTY]
    return _slot(state, empty[0], next_token_id=1, token_ready=True) if empty else None


def request_ids_collide(state: SystemState) -> SystemState | None:
    live = _live(state)
    if len(live) < 2:
        return None
    return _slot(state, live[1], request_id=state.scheduler.slots[live[0]].request_id)


def prefix_past_count(state: SystemState) -> SystemState | None:
    live = _live(state)
    return _slot(state, live[0], prefix_tokens=state.scheduler.slots[live[0]].token_count + 1) if live else None


def entry_over_capacity(state: SystemState) -> SystemState | None:
    longest = max((len(entry.page_set.pages) for entry in state.store.entries if entry is not None), default=0)
    return replace(state, store=replace(state.store, page_capacity=longest - 1)) if longest >= 2 else None


def identities_collide(state: SystemState) -> SystemState | None:
    used = _entries(state)
    if len(used) < 2:
        return None
    first, second = (state.store.entries[index] for index in used[:2])
    assert first is not None and second is not None
    return _entry(state, used[1], page_set=replace(second.page_set, identity=first.page_set.identity))


def entry_used_at_the_clock(state: SystemState) -> SystemState | None:
    used = _entries(state)
    return _entry(state, used[0], last_used=state.store.clock) if used else None


def entry_page_past_the_pool(state: SystemState) -> SystemState | None:
    used = _entries(state)
    if not used:
        return None
    entry = state.store.entries[used[0]]
    assert entry is not None
    pages = (*entry.page_set.pages[:-1], len(state.pool.refs))
    return _count(_entry(state, used[0], page_set=replace(entry.page_set, pages=pages)), entry.page_set.pages[-1], -1)


def external_hold_on_a_free_page(state: SystemState) -> SystemState | None:
    free = state.pool.free
    return replace(state, external=tuple(sorted((*state.external, free[-1])))) if free else None


def external_hold_dropped(state: SystemState) -> SystemState | None:
    return replace(state, external=state.external[1:]) if state.external else None


CORRUPTIONS: tuple[Corruption, ...] = (
    count_too_high,
    count_too_low,
    count_below_zero,
    count_below_zero_off_the_stack,
    count_past_maximum,
    free_page_pushed_twice,
    held_page_pushed,
    free_page_lost,
    table_maps_page_twice,
    table_maps_a_free_page,
    table_maps_a_page_counted_below_zero,
    table_maps_a_page_past_the_pool,
    live_slot_marked_empty,
    empty_slot_keeps_a_field,
    request_ids_collide,
    prefix_past_count,
    entry_over_capacity,
    identities_collide,
    entry_used_at_the_clock,
    entry_page_past_the_pool,
    external_hold_on_a_free_page,
    external_hold_dropped,
)


@cache
def reachable() -> tuple[SystemState, ...]:
    """The first `STATES` states of a breadth-first exploration of `BOUNDS`, each keeping every invariant."""
    explorer = Explorer(BOUNDS)
    result = explorer.run(max_states=STATES)
    assert result.violation is None
    return tuple(explorer.states)


@cache
def corrupted() -> tuple[tuple[str, SystemState], ...]:
    """Each corruption applied to up to `PER_CORRUPTION` reachable states, spread evenly."""
    found = []
    for corrupt in CORRUPTIONS:
        applied = [state for state in map(corrupt, reachable()) if state is not None]
        step = max(1, len(applied) // PER_CORRUPTION)
        found += [(corrupt.__name__, state) for state in applied[::step][:PER_CORRUPTION]]
    return tuple(found)


@cache
def evaluator() -> Evaluator:
    """One evaluator for the module: each conjunct of each state is decided once."""
    return Evaluator()


def every_state() -> tuple[SystemState, ...]:
    """The reachable states, then the corrupted ones."""
    return (*reachable(), *(state for _, state in corrupted()))


def test_every_corruption_applies_and_breaks_an_invariant() -> None:
    names = [name for name, _ in corrupted()]
    assert {corrupt.__name__: names.count(corrupt.__name__) for corrupt in CORRUPTIONS} == {
        corrupt.__name__: PER_CORRUPTION for corrupt in CORRUPTIONS
    }
    assert all(check_invariants(state) for _, state in corrupted())


def test_every_spec_invariant_is_carried_or_holds_by_construction() -> None:
    assert set(carried(CONJUNCTS)) | set(BY_CONSTRUCTION) == set(INVARIANTS)
    assert not set(carried(CONJUNCTS)) & set(BY_CONSTRUCTION)
    assert set(invariant.SPEC_INVARIANTS_BY_CONSTRUCTION) == set(BY_CONSTRUCTION)


def test_every_carried_invariant_fails_on_some_corrupted_state() -> None:
    failing = {name for _, state in corrupted() for name in check_invariants(state)}
    assert failing == {inv.__name__ for inv in carried(CONJUNCTS)}


@pytest.mark.proof
def test_the_conjuncts_agree_with_the_spec_on_every_state() -> None:
    assert disagreements(every_state(), CHECKED, evaluator()) == []


def test_each_exception_for_a_leaned_on_invariant_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agreement, "LEANS_ON", {})
    states = [state for _, state in corrupted()]
    found = {(corrupted()[d.state][0], d.about, d.spec, d.model) for d in disagreements(states, CHECKED, evaluator())}
    assert found == {
        ("count_below_zero_off_the_stack", "inv_free_stack_exact", True, False),
        ("table_maps_a_page_counted_below_zero", "inv_tables_hold_their_pages", True, False),
    }


def _drift(name: str, holds: Callable[[Sys], z3.BoolRef]) -> tuple[Conjunct, ...]:
    """`CHECKED` with one conjunct's formula replaced (the real module is untouched)."""
    return tuple(replace(c, holds=holds) if c.name == name else c for c in CHECKED)


def _strict_bound(s: Sys) -> z3.BoolRef:  # `<` for `<=`
    (p,) = bound("p")
    return z3.ForAll([p], z3.Implies(in_pages(s, p), z3.And(s.refs[p] >= 0, s.refs[p] < s.max_refs)))


def _stack_ignoring_duplicates(s: Sys) -> z3.BoolRef:  # no `pos[stack[i]] == i`, no `top + held == pages`
    i, p = bound("i p")
    return z3.And(
        z3.ForAll([i], z3.If(between(0, i, s.top), in_pages(s, s.stack[i]), s.stack[i] == NONE)),
        z3.ForAll(
            [p],
            z3.Or(s.pos[p] == NONE, z3.And(in_pages(s, p), between(0, s.pos[p], s.top), s.stack[s.pos[p]] == p)),
        ),
        z3.ForAll([p], z3.Implies(in_pages(s, p), (s.refs[p] == 0) == (s.pos[p] != NONE))),
    )


@pytest.mark.parametrize(
    ("name", "holds", "about", "where"),
    [
        ("refcounts_bounded", _strict_bound, "inv_refcounts_bounded", "reachable"),  # a count at the maximum
        ("free_stack_exact", _stack_ignoring_duplicates, "inv_free_stack_exact", "free_page_pushed_twice"),
    ],
    ids=["strict-bound", "stack-ignores-duplicates"],
)
def test_a_drifted_conjunct_disagrees(name: str, holds: Callable[[Sys], z3.BoolRef], about: str, where: str) -> None:
    found = disagreements(every_state(), _drift(name, holds), evaluator())
    assert {d.about for d in found} == {"the invariant", about}
    names = ("reachable",) * len(reachable()) + tuple(name for name, _ in corrupted())
    assert where in {names[d.state] for d in found}
