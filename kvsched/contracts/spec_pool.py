"""Contracts on the spec's page transitions (`spec/pool.py`, `spec/table.py`), for CrossHair.

Every contract holds for *every* valid system of its shape (3 pages, external holders, one or
two request slots with 2-entry tables): the precondition bounds the ints and requires every
invariant (`holds`); the postconditions say that every invariant still holds once the caller's
owner bookkeeping is applied (a refused step leaves `after == before`), that the transition is
enabled exactly when its enabling condition holds, and what it does to the free stack (LIFO)
and to the written page (exclusive).
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.contracts.support import (
    PAGES,
    Transition,
    holds,
    in_range,
    make_slot,
    make_system,
    make_table,
    popped,
    pushed,
    run_step,
    with_external,
    with_slot,
)
from kvsched.spec import pool as pool_ops
from kvsched.spec import table as table_ops
from kvsched.spec.invariants import post_written_page_exclusive
from kvsched.spec.pool import Allocated, Copy, CopyOnWrite, Existing
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages

# -- predicates the postconditions use -------------------------------------------------------


def has_free(state: SystemState) -> bool:
    """Some page has no reference."""
    return 0 in state.pool.refs


def is_held(state: SystemState, page: int, below: int | None = None) -> bool:
    """`page` is in range and held (with fewer than `below` references, when given)."""
    if not 0 <= page < PAGES:
        return False
    count = state.pool.refs[page]
    return count > 0 and (below is None or count < below)


def pops_top(step: Transition[int]) -> bool:
    """Exactly the top of the free stack left it, and it is the page handed out."""
    return popped(step.before.pool, step.after.pool) == (step.value,)


def pushes_if_last(step: Transition[None], page: int) -> bool:
    """`page` went on top of the free stack iff its last reference was dropped; nothing else moved."""
    last = step.before.pool.refs[page] == 1
    return pushed(step.before.pool, step.after.pool) == ((page,) if last else ())


def written_page(action: CopyOnWrite) -> int:
    """The page a write goes to after `action`."""
    return action.destination if isinstance(action, Copy) else action.page


def can_write(state: SystemState, current: int) -> bool:
    """`current` is exclusively held already, or a page is free for a fresh one or a copy."""
    return (current >= 0 and state.pool.refs[current] == 1) or has_free(state)


def is_cow(step: Transition[CopyOnWrite], current: int) -> bool:
    """The write goes to a page with one reference; `Existing` changes nothing; `Allocated` only
    for an unmapped entry; a `Copy` of the shared `current` goes to the old top of the stack."""
    action, before, after = step.value, step.before, step.after
    if action is None or after.pool.refs[written_page(action)] != 1:
        return False
    if isinstance(action, Existing):
        return action.page == current and after.pool == before.pool
    if isinstance(action, Allocated):
        return current < 0 and action.page == before.pool.free[-1]
    return action.source == current and action.destination == before.pool.free[-1]


def one_request(t0: int, t1: int, e0: int, e1: int, e2: int, order: int, limit: int = 4) -> SystemState:
    """Request 1 (PREFILL) in slot 0 with table (t0, t1), an empty slot 1, external holders."""
    slots = (make_slot(1, 1, make_table(t0, t1)), make_slot(0, 0, (None, None)))
    return make_system((e0, e1, e2), order, slots, max_references=limit)


def request_table(state: SystemState, slot: int = 0) -> tuple[int | None, ...]:
    """The table in `slot`."""
    return state.scheduler.slots[slot].table


# -- pool ---------------------------------------------------------------------------------------


def pool_allocate(e0: int, e1: int, e2: int, order: int) -> Transition[int]:
    """Allocation succeeds iff a page is free and pops the top of the stack for one new owner.

    pre: in_range(e0, e1, e2, high=4) and 0 <= order < 6
    post: holds(__return__.after)
    post: __return__.ok == has_free(__return__.before)
    post: not __return__.ok or pops_top(__return__)
    """
    before = make_system((e0, e1, e2), order)

    def transition() -> tuple[SystemState, int]:
        pool, page = pool_ops.allocate(before.pool)
        return with_external(replace(before, pool=pool), add=(page,)), page

    return run_step(before, transition)


def pool_retain(e0: int, e1: int, e2: int, order: int, page: int) -> Transition[None]:
    """Retaining succeeds iff the page is held below the maximum; the free stack is untouched.

    pre: in_range(e0, e1, e2, high=4) and 0 <= order < 6 and -1 <= page <= PAGES
    post: holds(__return__.after)
    post: __return__.ok == is_held(__return__.before, page, below=4)
    """
    before = make_system((e0, e1, e2), order)

    def transition() -> tuple[SystemState, None]:
        pool = pool_ops.retain(before.pool, page)
        return with_external(replace(before, pool=pool), add=(page,)), None

    return run_step(before, transition)


def pool_release(e0: int, e1: int, e2: int, order: int, page: int) -> Transition[None]:
    """Releasing succeeds iff the page is held; a page whose count reaches 0 goes on top.

    pre: in_range(e0, e1, e2, high=4) and 0 <= order < 6 and -1 <= page <= PAGES
    post: holds(__return__.after)
    post: __return__.ok == is_held(__return__.before, page)
    post: not __return__.ok or pushes_if_last(__return__, page)
    """
    before = make_system((e0, e1, e2), order)

    def transition() -> tuple[SystemState, None]:
        pool = pool_ops.release(before.pool, page)
        return with_external(replace(before, pool=pool), drop=(page,)), None

    return run_step(before, transition)


def pool_writable(e0: int, e1: int, e2: int, order: int, current: int) -> Transition[CopyOnWrite]:
    """The caller (an external holder of `current`, or of nothing for -1) ends up owning its
    page alone: in place at count 1, else a fresh page allocated before the source is released.

    pre: in_range(e0, e1, e2, high=4) and 0 <= order < 6 and -1 <= current < PAGES
    pre: current < 0 or (e0, e1, e2)[current] > 0
    post: holds(__return__.after)
    post: __return__.ok == can_write(__return__.before, current)
    post: not __return__.ok or is_cow(__return__, current)
    """
    before = make_system((e0, e1, e2), order)

    def transition() -> tuple[SystemState, CopyOnWrite]:
        pool, action = pool_ops.writable(before.pool, None if current < 0 else current)
        moved = with_external(replace(before, pool=pool), add=(written_page(action),))
        return with_external(moved, drop=(current,) if current >= 0 else ()), action

    return run_step(before, transition)


# -- tables -------------------------------------------------------------------------------------


def table_ensure_writable(
    t0: int, t1: int, e0: int, e1: int, e2: int, order: int, logical: int
) -> Transition[CopyOnWrite]:
    """A request's logical page becomes exclusively its own, or nothing changes.

    pre: in_range(t0, t1, low=-1) and in_range(e0, e1, e2, high=2) and 0 <= order < 6 and -1 <= logical <= 2
    pre: t0 < 0 or t0 != t1
    post: holds(__return__.after)
    post: __return__.ok == (0 <= logical < 2 and can_write(__return__.before, (t0, t1)[logical]))
    post: not __return__.ok or post_written_page_exclusive(__return__.after, 1, logical)
    """
    before = one_request(t0, t1, e0, e1, e2, order)

    def transition() -> tuple[SystemState, CopyOnWrite]:
        slot = before.scheduler.slots[0]
        table, pool, action = table_ops.ensure_writable(slot.table, before.pool, logical)
        return with_slot(replace(before, pool=pool), 0, replace(slot, table=table)), action

    return run_step(before, transition)


def table_fork(t0: int, t1: int, e0: int, e1: int, e2: int, order: int, limit: int) -> Transition[None]:
    """A fork shares every mapped page (one more reference each) unless one is at the maximum.

    pre: in_range(t0, t1, low=-1) and in_range(e0, e1, e2, high=2) and 0 <= order < 6 and 2 <= limit <= 4
    pre: (t0 < 0 or t0 != t1) and e0 < limit and e1 < limit and e2 < limit
    post: holds(__return__.after)
    post: __return__.ok == all(is_held(__return__.before, p, limit) for p in get_mapped_pages(make_table(t0, t1)))
    post: not __return__.ok or request_table(__return__.after, 1) == make_table(t0, t1)
    """
    before = one_request(t0, t1, e0, e1, e2, order, limit)

    def transition() -> tuple[SystemState, None]:
        table, pool = table_ops.fork(request_table(before, 0), request_table(before, 1), before.pool)
        return with_slot(replace(before, pool=pool), 1, make_slot(1, 2, table)), None

    return run_step(before, transition)


def table_install_shared_prefix(
    p0: int, p1: int, p2: int, count: int, e0: int, e1: int, e2: int, order: int
) -> Transition[None]:
    """A prefix of distinct pages is installed whole into an empty table, or not at all.

    pre: in_range(p0, p1, p2, low=-1, high=PAGES) and 0 <= count <= 3
    pre: len(set((p0, p1, p2)[:count])) == count and in_range(e0, e1, e2, high=4) and 0 <= order < 6
    post: holds(__return__.after)
    post: __return__.ok == (count <= 2 and all(is_held(__return__.before, p, 4) for p in (p0, p1, p2)[:count]))
    post: not __return__.ok or request_table(__return__.after) == make_table(*(p0, p1, p2)[:count], -1, -1)[:2]
    """
    pages = (p0, p1, p2)[:count]
    before = one_request(-1, -1, e0, e1, e2, order)

    def transition() -> tuple[SystemState, None]:
        table, pool = table_ops.install_shared_prefix(request_table(before), before.pool, pages)
        return with_slot(replace(before, pool=pool), 0, replace(before.scheduler.slots[0], table=table)), None

    return run_step(before, transition)


def table_release_all(t0: int, t1: int, e0: int, e1: int, e2: int, order: int) -> Transition[None]:
    """Releasing a table frees exactly the pages only it held, pushed in logical order.

    pre: in_range(t0, t1, low=-1) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: t0 < 0 or t0 != t1
    post: __return__.ok and holds(__return__.after)
    post: pushed(__return__.before.pool, __return__.after.pool) == last_references(__return__.before, t0, t1)
    """
    before = one_request(t0, t1, e0, e1, e2, order)

    def transition() -> tuple[SystemState, None]:
        table, pool = table_ops.release_all(request_table(before), before.pool)
        return with_slot(replace(before, pool=pool), 0, replace(before.scheduler.slots[0], table=table)), None

    return run_step(before, transition)


def last_references(state: SystemState, *entries: int) -> tuple[int, ...]:
    """The mapped entries, in order, whose page has exactly one reference."""
    return tuple(page for page in entries if page >= 0 and state.pool.refs[page] == 1)


# The names only the docstring conditions use (CrossHair evaluates them in this module's globals).
CONDITION_VOCABULARY = (get_mapped_pages, holds, in_range, post_written_page_exclusive)
