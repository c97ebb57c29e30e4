"""How impl refines the spec: abstraction functions, representation invariants, the debug check.

    impl object           abstraction function (`to_spec`)                 spec value
    BlockPool             refs, free[:top], max_references            ->  PoolState
    SequenceBlockTable    row, INVALID_BLOCK -> None                  ->  Table
    PrefixKvStore         entry arrays (see impl/prefix.py)           ->  StoreState
    RequestScheduler      slot arrays (see impl/slots.py)             ->  SchedulerState
    the four together     + external holders                          ->  SystemState

The abstraction is only meaningful where the representation invariants hold: the parts of impl
state the spec does not have (the scheduler's and the store's indexes, the free stack's `top`)
must agree with the arrays. Refinement, as the lockstep tests check it: for every operation and
input, `to_spec(impl after op) == spec transition(to_spec(impl before))`, with equal results and
equal exception types and messages.

`check_impl` is the debug check: every representation invariant, then every spec invariant
(`kvsched.spec.invariants`) on the abstracted system.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from kvsched.impl.pool import BlockPool, get_arrays
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix import get_indexes as get_store_indexes
from kvsched.impl.scheduler import RequestScheduler, get_indexes, get_slots
from kvsched.impl.slots import DECODE, EMPTY, STATE_CODES
from kvsched.impl.table import SequenceBlockTable
from kvsched.spec.invariants import check_invariants
from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import StoreState
from kvsched.spec.slots import SchedulerState
from kvsched.spec.system import SystemState
from kvsched.spec.table import Table


def abstract_pool(pool: BlockPool) -> PoolState:
    """The pool's spec state."""
    return pool.to_spec()


def abstract_table(table: SequenceBlockTable) -> Table:
    """A standalone table's spec state."""
    return table.to_spec()


def abstract_store(store: PrefixKvStore) -> StoreState:
    """The store's spec state."""
    return store.to_spec()


def abstract_scheduler(scheduler: RequestScheduler) -> SchedulerState:
    """The scheduler's spec state."""
    return scheduler.to_spec()


def abstract_system(
    pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler, external: Iterable[int] = ()
) -> SystemState:
    """The whole system's spec state; `external` lists one page per reference held outside."""
    return SystemState(pool.to_spec(), store.to_spec(), scheduler.to_spec(), tuple(sorted(external)))


def _is_exact_heap(heap: list[int], members: list[int]) -> bool:
    return sorted(heap) == members and all(
        heap[parent] <= heap[child] for child in range(1, len(heap)) for parent in [(child - 1) // 2]
    )


def rep_pool_top_in_range(pool: BlockPool) -> bool:
    """The free stack's top lies within the stack."""
    arrays = get_arrays(pool)
    return 0 <= int(arrays.top[0]) <= int(arrays.refs.shape[0])


def rep_store_index_exact(store: PrefixKvStore) -> bool:
    """The identity index maps exactly the occupied entries to themselves."""
    identities, index, _, _ = get_store_indexes(store)
    occupied = {identity: entry for entry, identity in enumerate(identities) if identity is not None}
    return index == occupied


def rep_store_empty_heap_exact(store: PrefixKvStore) -> bool:
    """The empty-entry heap holds exactly the unoccupied entries, in heap order."""
    identities, _, empty, _ = get_store_indexes(store)
    return _is_exact_heap(empty, [entry for entry, identity in enumerate(identities) if identity is None])


def rep_store_counts_fit(store: PrefixKvStore) -> bool:
    """Occupied entries hold 1..capacity pages; empty ones hold none."""
    identities, _, _, page_counts = get_store_indexes(store)
    return all(
        (1 <= count <= store.page_capacity) if identity is not None else count == 0
        for identity, count in zip(identities, page_counts.tolist(), strict=True)
    )


def rep_scheduler_index_exact(scheduler: RequestScheduler) -> bool:
    """The request index maps exactly the live requests to their slots."""
    slot_of, _, _ = get_indexes(scheduler)
    slots = get_slots(scheduler)
    live = np.flatnonzero(slots.states != EMPTY).tolist()
    return slot_of == {int(slots.request_ids[slot]): slot for slot in live} and len(slot_of) == len(live)


def rep_scheduler_empty_heap_exact(scheduler: RequestScheduler) -> bool:
    """The empty-slot heap holds exactly the EMPTY slots, in heap order."""
    _, empty, _ = get_indexes(scheduler)
    return _is_exact_heap(empty, np.flatnonzero(get_slots(scheduler).states == EMPTY).tolist())


def rep_scheduler_decoding_count(scheduler: RequestScheduler) -> bool:
    """The DECODE count equals the number of DECODE slots."""
    _, _, decoding = get_indexes(scheduler)
    return decoding == int(np.count_nonzero(get_slots(scheduler).states == DECODE))


def rep_scheduler_states_known(scheduler: RequestScheduler) -> bool:
    """Every slot state code names a `RequestState`."""
    codes: set[int] = set(np.unique(get_slots(scheduler).states).tolist())
    return codes <= set(STATE_CODES.values())


REPRESENTATION_INVARIANTS: tuple[tuple[str, Callable[..., bool]], ...] = (
    ("pool", rep_pool_top_in_range),
    ("store", rep_store_index_exact),
    ("store", rep_store_empty_heap_exact),
    ("store", rep_store_counts_fit),
    ("scheduler", rep_scheduler_index_exact),
    ("scheduler", rep_scheduler_empty_heap_exact),
    ("scheduler", rep_scheduler_decoding_count),
    ("scheduler", rep_scheduler_states_known),
)


def check_representation(pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler) -> tuple[str, ...]:
    """The names of every representation invariant the impl objects violate."""
    objects = {"pool": pool, "store": store, "scheduler": scheduler}
    return tuple(check.__name__ for owner, check in REPRESENTATION_INVARIANTS if not check(objects[owner]))


def check_impl(
    pool: BlockPool, store: PrefixKvStore, scheduler: RequestScheduler, external: Iterable[int] = ()
) -> tuple[str, ...]:
    """The debug check: every violated representation invariant, then every violated spec
    invariant of the abstracted system (empty when all hold)."""
    broken = check_representation(pool, store, scheduler)
    if broken:
        return broken  # the abstraction is meaningless over a broken representation
    return check_invariants(abstract_system(pool, store, scheduler, external))


__all__ = [
    "REPRESENTATION_INVARIANTS",
    "abstract_pool",
    "abstract_scheduler",
    "abstract_store",
    "abstract_system",
    "abstract_table",
    "check_impl",
    "check_representation",
]
