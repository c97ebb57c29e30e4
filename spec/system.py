"""A whole kvsched system as one value: pool, prefix store, scheduler, automatic prefix cache
and external holders.

This is the state the invariants, the stateful harness and the proofs speak about. External
holders are owners outside kvsched (a producer that allocated prefix pages, a test's own hold):
each holds one reference per entry of `external`, a sorted multiset of page ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import StoreState
from kvsched.spec.prefix_cache import EMPTY_CACHE, CacheState
from kvsched.spec.slots import SchedulerState
from kvsched.spec.table import get_mapped_pages


@dataclass(frozen=True, slots=True)
class SystemState:
    """Everything that owns or tracks a page."""

    pool: PoolState
    store: StoreState
    scheduler: SchedulerState
    external: tuple[int, ...] = ()
    cache: CacheState = EMPTY_CACHE


def get_owner_references(state: SystemState) -> Counter[int]:
    """How many owner references each page has: tables + store entries + the cache + external
    holders."""
    owners: Counter[int] = Counter(state.external)
    for slot in state.scheduler.slots:
        owners.update(get_mapped_pages(slot.table))
    for entry in state.store.entries:
        if entry is not None:
            owners.update(entry.page_set.pages)
    owners.update(entry.page for entry in state.cache.pages)
    return owners
