"""The abstraction functions and the debug check.

Fresh impl objects abstract to the spec's initial states; the debug check passes on a consistent
system and names the invariant a corruption breaks (so it can fail).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched import impl, spec
from kvsched.impl.pool import get_arrays
from kvsched.impl.prefix import get_indexes as get_store_indexes
from kvsched.impl.refinement import REPRESENTATION_INVARIANTS, check_impl, check_representation
from kvsched.impl.scheduler import get_indexes, get_slots
from kvsched.spec import PrefixIdentity, PrefixPageSet


@given(st.integers(0, 64), st.integers(1, 5))
def test_fresh_pool_and_table_abstract_to_the_spec_initial_states(pages: int, references: int) -> None:
    assert (
        impl.BlockPool(pages, max_references=references).to_spec()
        == spec.BlockPool(pages, max_references=references).state
    )
    assert impl.SequenceBlockTable(pages + 1).to_spec() == spec.SequenceBlockTable(pages + 1).state


@given(st.integers(0, 8), st.integers(1, 8), st.integers(1, 8))
def test_fresh_store_and_scheduler_abstract_to_the_spec_initial_states(entries: int, pages: int, requests: int) -> None:
    assert impl.PrefixKvStore(entries, pages).to_spec() == spec.PrefixKvStore(entries, pages).state
    assert impl.RequestScheduler(requests, pages).to_spec() == spec.RequestScheduler(requests, pages).state


def _busy_system() -> impl.ImplSystem:
    system = impl.make_impl_system(3, 3, 8, 2, 2)
    pool, store, scheduler = system.pool, system.store, system.scheduler
    page = pool.allocate()
    store.publish(PrefixPageSet(PrefixIdentity((1, 1, 1, 1)), (page,), 5), pool)
    pool.release(page)
    scheduler.admit_with_prefix(7, PrefixIdentity((1, 1, 1, 1)), store, pool)
    scheduler.admit_with_prefix(8, None, store, pool)
    scheduler.ensure_writable(8, 1, pool)
    system.new_table(2).ensure_writable(0, pool)
    return system


def test_the_debug_check_passes_on_a_consistent_system() -> None:
    system = _busy_system()
    assert system.check() == ()
    assert check_impl(system.pool, system.store, system.scheduler, external=[3]) == ("inv_refcount_equals_owners",)


CORRUPTIONS: dict[str, Callable[[impl.ImplSystem], Any]] = {
    "rep_pool_top_in_range": lambda s: get_arrays(s.pool).top.__setitem__(0, 99),
    "rep_store_index_exact": lambda s: get_store_indexes(s.store)[1].clear(),
    "rep_store_empty_heap_exact": lambda s: heapq.heappush(get_store_indexes(s.store)[2], 0),
    "rep_store_counts_fit": lambda s: get_store_indexes(s.store)[3].__setitem__(0, 3),
    "rep_scheduler_index_exact": lambda s: get_indexes(s.scheduler)[0].__setitem__(99, 2),
    "rep_scheduler_empty_heap_exact": lambda s: heapq.heappop(get_indexes(s.scheduler)[1]),
    "rep_scheduler_decoding_count": lambda s: setattr(s.scheduler, "_decoding", 0),
    "rep_scheduler_states_known": lambda s: get_slots(s.scheduler).states.__setitem__(2, 7),
    "inv_refcount_equals_owners": lambda s: get_arrays(s.pool).refs.__setitem__(1, 2),
    "inv_free_stack_exact": lambda s: get_arrays(s.pool).free.__setitem__(int(get_arrays(s.pool).top[0]) - 1, 0),
    "inv_empty_slots_cleared": lambda s: get_slots(s.scheduler).token_counts.__setitem__(2, 1),
    "inv_tables_hold_their_pages": lambda s: get_slots(s.scheduler).tables[1].__setitem__(2, 6),
    "inv_prefix_tokens_within_count": lambda s: get_slots(s.scheduler).prefix_tokens.__setitem__(1, 1),
}


@pytest.mark.parametrize("broken", sorted(CORRUPTIONS))
def test_the_debug_check_names_what_a_corruption_breaks(broken: str) -> None:
    system = _busy_system()
    CORRUPTIONS[broken](system)
    assert broken in system.check()


def test_every_representation_invariant_has_a_corruption_that_breaks_it() -> None:
    names = {check.__name__ for _, check in REPRESENTATION_INVARIANTS}
    assert names <= set(CORRUPTIONS)
    system = _busy_system()
    assert check_representation(system.pool, system.store, system.scheduler) == ()
