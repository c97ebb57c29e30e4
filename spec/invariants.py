"""The invariants of a kvsched system, as named predicates over one `SystemState`.

Each `inv_*` takes the whole state and returns True when it holds. `INVARIANTS` collects them
for the stateful harness, the contracts, the proofs' explorer and impl's debug check.
`check_invariants` names every one that fails.

Some properties relate two states or need a record the state does not keep; they are stated
here as `post_*` predicates, which the stateful machine and the explorer both check:
`post_failure_changes_nothing`, `post_lifo_reuse` (after every step), `post_written_page_exclusive`
(after a write), `post_drained_all_free` (liveness, after draining); and the read-correctness
check over ghost memory (`kvsched.testing.ghost`: every position a request can read holds its own
history, or a shared prefix with exactly its tokens at exactly its positions).
"""

from __future__ import annotations

from collections.abc import Callable

from kvsched.spec.slots import RequestState, Slot, is_live
from kvsched.spec.system import SystemState, get_owner_references
from kvsched.spec.table import get_mapped_pages, is_empty_table


def inv_refcount_equals_owners(state: SystemState) -> bool:
    """Every page's reference count equals its owner references (tables, store, external)."""
    owners = get_owner_references(state)
    in_range = all(0 <= page < len(state.pool.refs) for page in owners)
    return in_range and all(count == owners.get(page, 0) for page, count in enumerate(state.pool.refs))


def inv_free_stack_exact(state: SystemState) -> bool:
    """A page is on the free stack iff its count is 0, at most once; free + held = total."""
    free = state.pool.free
    zero = {page for page, count in enumerate(state.pool.refs) if count == 0}
    return len(set(free)) == len(free) and set(free) == zero


def inv_refcounts_bounded(state: SystemState) -> bool:
    """No reference count exceeds the pool's maximum."""
    return all(0 <= count <= state.pool.max_references for count in state.pool.refs)


def _is_cleared(slot: Slot) -> bool:
    return (
        is_empty_table(slot.table)
        and slot.request_id == 0
        and slot.token_count == 0
        and slot.prefix_tokens == 0
        and slot.next_token_id == 0
        and not slot.token_ready
    )


def inv_empty_slots_cleared(state: SystemState) -> bool:
    """An empty slot has an empty table and every field cleared."""
    return all(_is_cleared(slot) for slot in state.scheduler.slots if slot.state is RequestState.EMPTY)


def inv_request_ids_unique(state: SystemState) -> bool:
    """No request id is live in two slots."""
    ids = [slot.request_id for slot in state.scheduler.slots if is_live(slot)]
    return len(ids) == len(set(ids))


def inv_tables_fixed_capacity(state: SystemState) -> bool:
    """Every slot's table has the scheduler's fixed capacity."""
    widths = {len(slot.table) for slot in state.scheduler.slots}
    return len(widths) == 1


def inv_tables_hold_their_pages(state: SystemState) -> bool:
    """A table names only held pages, each at most once (isolation: nothing reads a free page)."""
    for slot in state.scheduler.slots:
        pages = get_mapped_pages(slot.table)
        if len(pages) != len(set(pages)):
            return False
        if any(not 0 <= page < len(state.pool.refs) or state.pool.refs[page] == 0 for page in pages):
            return False
    return True


def inv_prefix_tokens_within_count(state: SystemState) -> bool:
    """A live request's prefix tokens never exceed its token count."""
    return all(slot.prefix_tokens <= slot.token_count for slot in state.scheduler.slots if is_live(slot))


def inv_store_entries_well_formed(state: SystemState) -> bool:
    """Store identities are unique and every entry fits the per-entry page capacity."""
    entries = [entry for entry in state.store.entries if entry is not None]
    identities = [entry.page_set.identity for entry in entries]
    fits = all(len(entry.page_set.pages) <= state.store.page_capacity for entry in entries)
    recent = all(entry.last_used < state.store.clock for entry in entries)
    return len(identities) == len(set(identities)) and fits and recent


def inv_cache_well_formed(state: SystemState) -> bool:
    """The automatic cache holds each page under one key and each key on one page, in page
    order, every page in range, every stamp before the clock."""
    cache = state.cache
    pages = [entry.page for entry in cache.pages]
    keys = [entry.key for entry in cache.pages]
    in_range = all(0 <= page < len(state.pool.refs) for page in pages)
    recent = all(0 <= entry.last_used <= cache.clock and entry.depth >= 0 for entry in cache.pages)
    return pages == sorted(set(pages)) and len(keys) == len(set(keys)) and in_range and recent


Invariant = Callable[[SystemState], bool]

INVARIANTS: tuple[Invariant, ...] = (
    inv_refcount_equals_owners,
    inv_free_stack_exact,
    inv_refcounts_bounded,
    inv_empty_slots_cleared,
    inv_request_ids_unique,
    inv_tables_fixed_capacity,
    inv_tables_hold_their_pages,
    inv_prefix_tokens_within_count,
    inv_store_entries_well_formed,
    inv_cache_well_formed,
)


def check_invariants(state: SystemState) -> tuple[str, ...]:
    """The names of every invariant `state` violates (empty when all hold)."""
    return tuple(invariant.__name__ for invariant in INVARIANTS if not invariant(state))


def post_failure_changes_nothing(before: SystemState, after: SystemState) -> bool:
    """An operation that raised left the whole system exactly as it was."""
    return before == after


def post_lifo_reuse(before: SystemState, after: SystemState) -> bool:
    """The free stack changed only at its top: every page popped is held now (handed out), every
    page pushed was held before (freed by this step), so a freed page is the next one reused."""
    old, new = before.pool.free, after.pool.free
    common = 0
    for page_before, page_after in zip(old, new, strict=False):
        if page_before != page_after:
            break
        common += 1
    popped, pushed = old[common:], new[common:]
    held_now = all(0 <= page < len(after.pool.refs) and after.pool.refs[page] > 0 for page in popped)
    held_before = all(0 <= page < len(before.pool.refs) and before.pool.refs[page] > 0 for page in pushed)
    return held_now and held_before


def post_drained_all_free(state: SystemState) -> bool:
    """After every request finished, every entry was removed and every outside hold dropped, every
    page is free (nothing leaks)."""
    return all(count == 0 for count in state.pool.refs) and len(state.pool.free) == len(state.pool.refs)


def post_written_page_exclusive(state: SystemState, request_id: int, logical_page: int) -> bool:
    """After `ensure_writable`, the page behind the written logical page has exactly one owner."""
    for slot in state.scheduler.slots:
        if is_live(slot) and slot.request_id == request_id:
            page = slot.table[logical_page]
            return page is not None and state.pool.refs[page] == 1
    return False
