"""The engine as a tiered cache: its pages, host tier, copies and leases as the tiered cache's
`TierState` (`kvsched.spec.tiers`), holder for holder.

`kvsched.proofs.tier_safety` proves in z3, for every number of device and host pages, that the
tiered cache's transitions keep two invariants: every page's count is its holders, and each
tier's free stack is exactly the pages nobody holds. Under this abstraction those invariants
speak about the engine, and `inv_engine_is_a_tiered_cache` says an engine state satisfies them:
the engine's device pages are conserved across requests, published prefixes, the cache, copies
in flight and leases, and its host pages across the host cache and copies.

The map:

    a live request's table, a published prefix    a `Holding` each (its pages; keys are not read)
    the device cache                               the device tier's cache
    a copy in flight                               a `Transfer`: its device page and host page
    a leased page                                  a `Lease`
    the pool's counts and free stack               the device tier's
    the host tier's free stack and cache           the host tier's; a host page's count is the
                                                   holders the host tier names (it keeps no
                                                   counts), so there the invariant checks the
                                                   free stack

The system's `external` holds are not mapped: they are how the copies' and leases' holds are
kept, so a lease or copy whose hold is missing (or an external hold no copy or lease explains)
leaves a device page's count apart from its holders.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsched.spec.host_tier import HostState
from kvsched.spec.slots import is_live
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages
from kvsched.spec.tiers import (
    Cached,
    Holding,
    Lease,
    Tier,
    TierState,
    Transfer,
    counts_are_holders,
    free_is_unheld,
)

CONSERVED = (counts_are_holders, free_is_unheld)  # the invariants `tier_safety` proves (its CARRIED)


def as_tiers(system: SystemState, host: HostState, leased: Sequence[Sequence[int]]) -> TierState:
    """The engine (its system, host tier and each lease's pages) as the tiered cache's state."""
    holdings = [
        Holding(slot.request_id, tuple(pages), tuple(pages))
        for slot in system.scheduler.slots
        if is_live(slot)
        for pages in [get_mapped_pages(slot.table)]
    ]
    holdings += [
        Holding(-1 - index, entry.page_set.pages, entry.page_set.pages)
        for index, entry in enumerate(system.store.entries)
        if entry is not None
    ]
    pages = len(system.pool.refs)
    device = Tier(
        system.pool.refs,
        system.pool.free,
        (None,) * pages,
        tuple(Cached(entry.page, entry.key) for entry in system.cache.pages),
    )
    host_refs = [0] * host.pages
    for entry in host.cache:
        host_refs[entry.page] += 1
    for copy in host.copies:
        host_refs[copy.host_page] += 1
    host_tier = Tier(
        tuple(host_refs), host.free, (None,) * host.pages, tuple(Cached(entry.page, entry.key) for entry in host.cache)
    )
    transfers = tuple(
        Transfer(copy.transfer_id, copy.kind, copy.page, copy.host_page, copy.key) for copy in host.copies
    )
    leases = tuple(Lease(number, page, None) for number, page in enumerate(page for pages in leased for page in pages))
    return TierState(device, host_tier, tuple(holdings), transfers, leases)


def is_a_tiered_cache(system: SystemState, host: HostState, leased: Sequence[Sequence[int]]) -> bool:
    """The tiered cache's conservation invariants hold on the engine's abstraction (False, too,
    when a host page a cache entry or copy names is outside the host tier)."""
    named = [entry.page for entry in host.cache] + [copy.host_page for copy in host.copies]
    if not all(0 <= page < host.pages for page in named):
        return False
    tiers = as_tiers(system, host, leased)
    return all(invariant(tiers) for invariant in CONSERVED)
