"""Contracts on the spec's prefix store (`spec/prefix.py`), for CrossHair.

The store has two entries (`a`, `b`: a prefix number, or -1 for an empty entry; a page mask of
one or two of the 3 pages; a last-used stamp below the clock 4) and the pool's other owners are
request 1's table (empty, in slot 0, for `attach`) and external holders (the producer).
Postconditions: every invariant holds after; publishing retains before it becomes visible and
lands in the same-identity entry, else the lowest empty one, else the round-robin victim;
attaching installs all pages or none and stamps the entry; reclaiming evicts only idle entries,
least recently used first, and stops at the target.
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.contracts.support import (
    Transition,
    holds,
    identity,
    in_range,
    make_entry,
    make_slot,
    make_system,
    mask_pages,
    run_step,
    with_slot,
)
from kvsched.spec import prefix as prefix_ops
from kvsched.spec.identity import derive_prefix_identity
from kvsched.spec.prefix import PrefixPageSet, StoreEntry, is_idle
from kvsched.spec.system import SystemState

# One or two of the 3 pages: what a 2-page entry can hold. Contiguous, so `valid_store` tests it
# as a range: a tuple membership test branches six ways for CrossHair, and the rest of the
# precondition then repeats under every branch (at 2 s a condition, every path of
# `prefix_publish` failed its precondition).
MASKS = (1, 2, 3, 4, 5, 6)


def two_entries(
    a: int,
    a_mask: int,
    a_used: int,
    b: int,
    b_mask: int,
    b_used: int,
    e: tuple[int, int, int],
    order: int,
    victim: int = 0,
) -> SystemState:
    """Entries `a` and `b`, request 1 with an empty table, external references `e`."""
    entries = (make_entry(a, a_mask, a_used), make_entry(b, b_mask, b_used))
    return make_system(e, order, (make_slot(1, 1, (None, None)),), entries, next_victim=victim)


def valid_store(a: int, a_mask: int, a_used: int, b: int, b_mask: int, b_used: int) -> bool:
    """Two well-formed entries with distinct prefixes (or empty)."""
    return (
        in_range(a, b, low=-1)
        and (a < 0 or a != b)
        and in_range(a_mask, b_mask, low=MASKS[0], high=MASKS[-1])
        and in_range(a_used, b_used, high=3)
    )


def get_pages(state: SystemState, ident: int) -> tuple[int, ...] | None:
    """The pages published under prefix `ident`, if any."""
    index = prefix_ops.find_entry(state.store, identity(ident))
    entry = None if index is None else state.store.entries[index]
    return None if entry is None else entry.page_set.pages


def can_publish(state: SystemState, mask: int) -> bool:
    """The set fits an entry and every page is held below the maximum (4)."""
    pages = mask_pages(mask)
    return len(pages) <= state.store.page_capacity and all(state.pool.refs[p] in (1, 2, 3) for p in pages)


def lands_where_promised(step: Transition[None], ident: int, mask: int) -> bool:
    """The pages are visible under `ident` in the same-identity entry, else the lowest empty
    one, else the victim `next_victim % entries`; the other entry is untouched."""
    if get_pages(step.after, ident) != mask_pages(mask):
        return False
    before, after = step.before.store, step.after.store
    same = prefix_ops.find_entry(before, identity(ident))
    empty = next((i for i, entry in enumerate(before.entries) if entry is None), None)
    target = same if same is not None else empty if empty is not None else before.next_victim % len(before.entries)
    other = 1 - target
    return prefix_ops.find_entry(after, identity(ident)) == target and after.entries[other] == before.entries[other]


def attaches_all(step: Transition[int | None], ident: int) -> bool:
    """A hit maps every published page, in order, reports its tokens and stamps the entry."""
    pages = get_pages(step.before, ident)
    if pages is None or step.value is None:
        return pages is None and step.value is None and step.after == step.before
    index = prefix_ops.find_entry(step.after.store, identity(ident))
    entry = None if index is None else step.after.store.entries[index]
    table = step.after.scheduler.slots[0].table
    stamped = entry is not None and entry.last_used == step.before.store.clock
    return table[: len(pages)] == pages and entry is not None and step.value == entry.page_set.token_count and stamped


def idle_order(state: SystemState) -> list[int]:
    """The idle entries, least recently used first (ties: lowest entry)."""
    entries = [(entry.last_used, i) for i, entry in enumerate(state.store.entries) if entry is not None]
    return [i for used, i in sorted(entries) if is_idle(state.store, state.pool, _entry(state, i))]


def _entry(state: SystemState, index: int) -> StoreEntry:
    entry = state.store.entries[index]
    assert entry is not None
    return entry


def freed(step: Transition[int]) -> int:
    """How many more pages are free after the step."""
    return len(step.after.pool.free) - len(step.before.pool.free)


def evicts_lru(step: Transition[int], target: int) -> bool:
    """Evicted entries are the least recently used idle ones, and eviction stopped at the target
    or when no idle entry was left."""
    evicted = [
        i
        for i, entry in enumerate(step.before.store.entries)
        if entry is not None and step.after.store.entries[i] is None
    ]
    idle = idle_order(step.before)
    reached = len(step.after.pool.free) >= target or len(evicted) == len(idle)
    return set(evicted) == set(idle[: len(evicted)]) and reached


def prefix_publish(
    a: int,
    a_mask: int,
    a_used: int,
    b: int,
    b_mask: int,
    b_used: int,
    e0: int,
    e1: int,
    e2: int,
    order: int,
    ident: int,
    mask: int,
    victim: int,
) -> Transition[None]:
    """Publishing the producer's pages (it keeps its own references) makes them visible.

    pre: valid_store(a, a_mask, a_used, b, b_mask, b_used) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: 0 <= ident <= 2 and 1 <= mask <= 7 and 0 <= victim <= 1
    post: holds(__return__.after)
    post: __return__.ok == can_publish(__return__.before, mask)
    post: not __return__.ok or lands_where_promised(__return__, ident, mask)
    """
    before = two_entries(a, a_mask, a_used, b, b_mask, b_used, (e0, e1, e2), order, victim)

    def transition() -> tuple[SystemState, None]:
        page_set = PrefixPageSet(identity(ident), mask_pages(mask), 3)
        store, pool = prefix_ops.publish(before.store, before.pool, page_set)
        return replace(before, store=store, pool=pool), None

    return run_step(before, transition)


def prefix_attach(
    a: int,
    a_mask: int,
    a_used: int,
    b: int,
    b_mask: int,
    b_used: int,
    e0: int,
    e1: int,
    e2: int,
    order: int,
    ident: int,
) -> Transition[int | None]:
    """Attaching a published prefix installs all its pages (or, any retain refused, none).

    pre: valid_store(a, a_mask, a_used, b, b_mask, b_used) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: 0 <= ident <= 3
    post: holds(__return__.after)
    post: __return__.ok == all(__return__.before.pool.refs[p] < 4 for p in get_pages(__return__.before, ident) or ())
    post: not __return__.ok or attaches_all(__return__, ident)
    """
    before = two_entries(a, a_mask, a_used, b, b_mask, b_used, (e0, e1, e2), order)

    def transition() -> tuple[SystemState, int | None]:
        slot = before.scheduler.slots[0]
        store, table, pool, tokens = prefix_ops.attach(before.store, slot.table, before.pool, identity(ident))
        return with_slot(replace(before, store=store, pool=pool), 0, replace(slot, table=table)), tokens

    return run_step(before, transition)


def prefix_remove(
    a: int,
    a_mask: int,
    a_used: int,
    b: int,
    b_mask: int,
    b_used: int,
    e0: int,
    e1: int,
    e2: int,
    order: int,
    ident: int,
) -> Transition[bool]:
    """Removing drops the entry and its references; it reports whether there was one.

    pre: valid_store(a, a_mask, a_used, b, b_mask, b_used) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: 0 <= ident <= 3
    post: holds(__return__.after)
    post: __return__.value == (get_pages(__return__.before, ident) is not None)
    post: get_pages(__return__.after, ident) is None
    """
    before = two_entries(a, a_mask, a_used, b, b_mask, b_used, (e0, e1, e2), order)

    def transition() -> tuple[SystemState, bool]:
        store, pool, removed = prefix_ops.remove(before.store, before.pool, identity(ident))
        return replace(before, store=store, pool=pool), removed

    return run_step(before, transition)


def prefix_reclaim(
    a: int,
    a_mask: int,
    a_used: int,
    b: int,
    b_mask: int,
    b_used: int,
    e0: int,
    e1: int,
    e2: int,
    order: int,
    target: int,
) -> Transition[int]:
    """Reclaiming evicts idle entries, least recently used first, until `target` pages are free.

    pre: valid_store(a, a_mask, a_used, b, b_mask, b_used) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: -1 <= target <= 4
    post: holds(__return__.after)
    post: __return__.ok == (target >= 0)
    post: not __return__.ok or __return__.value == freed(__return__)
    post: not __return__.ok or evicts_lru(__return__, target)
    """
    before = two_entries(a, a_mask, a_used, b, b_mask, b_used, (e0, e1, e2), order)

    def transition() -> tuple[SystemState, int]:
        store, pool, freed = prefix_ops.reclaim(before.store, before.pool, target)
        return replace(before, store=store, pool=pool), freed

    return run_step(before, transition)


def tenants_differ(
    model: int, context: int, fact: int, salt: int, other_salt: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two tenants derive identities for the same prefix that share no word.

    pre: in_range(model, context, fact, salt, other_salt, high=2**64 - 1) and salt != other_salt
    post: all(mine != theirs for mine, theirs in zip(*__return__))
    """
    facts = [(fact, 1, 2, 3, 4, 5)]
    mine = derive_prefix_identity(model, 1, context, 2, facts, tenant_salt=salt)
    theirs = derive_prefix_identity(model, 1, context, 2, facts, tenant_salt=other_salt)
    return mine.words, theirs.words


# The names only the docstring conditions use (CrossHair evaluates them in this module's globals).
CONDITION_VOCABULARY = (holds, mask_pages)
