"""z3 proofs for the tiered cache (`kvsched.spec.tiers`): for every number of device pages and of
host pages, every page's count is its holders and a tier's free stack holds exactly the pages
nobody holds. So a page a copy or a lease holds is never handed to another owner, on either tier.

The state (unbounded arrays over the integers; `device` and `host` pages, any sizes):

    d_refs[p]   a device page's count       h_refs[h]   a host page's count
    d_free[p]   times p is on the free stack h_free[h]  times h is on its free stack
    d_req[p]    requests that hold p
    d_cached[p] 1 when the device cache holds p         h_cached[h]  1 when the host cache holds h
    d_copy[p]   copies in flight that hold p            h_copy[h]    copies in flight that hold h
    d_lease[p]  leases on p

The invariant, for every page of each tier: its count is the sum of its holders, each of them
non-negative (a cache holds a page at most once), and the page is on its free stack once when its
count is 0 and never otherwise.

Transitions, each with free variables `p` (a device page) and `h` (a host page):

    take         a free device page is handed to a request (a fresh page of a commit)
    attach       a request attaches a cached device page (a hit)
    release      a request lets go of a page (a free, a cancel, a preemption)
    cache        a request's page enters the device cache
    evict        a cached device page only the cache holds leaves it, and is free
    lease        an asynchronous reader holds a held page; `end_lease`: it lets go
    demote       a cached device page is copied to a free host page: the copy holds both
    demoted      the copy completes (the host cache takes its hold on the host page) or fails
                 (it lets go of it); either way it lets go of the device page
    promote      a cached host page is copied into a request's fresh page: the copy holds both
    promoted     the copy completes (the device cache takes its hold, unless the page is cached
                 already) or fails; either way it lets go of the host page
    host_evict   a cached host page only the host cache holds leaves it, and is free

Each is proved to keep the invariant (`unsat` of its negation at every size) and shown enabled.
The broken forms, each an upstream bug's shape, are refuted with a counterexample at a bounded
size: a release that lets go of the page's lease too (SGLang #24527, DingoCache PR #76: the
lease-free reuse), a take of a page that is not free (vLLM #37076: a page reused under its
reader), a host eviction of a page a copy still reads (SGLang PR #38480), a release counted twice
(vLLM #42571), and a completed demotion whose count on the device page stays (a leak).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every, invariant_holds
from kvsched.spec.tiers import TierState, counts_are_holders, free_is_unheld

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)
BOUND = 3  # bounded checks: 3 device pages and 3 host pages

DEVICE = ("d_refs", "d_free", "d_req", "d_cached", "d_copy", "d_lease")
HOST = ("h_refs", "h_free", "h_cached", "h_copy")
FIELDS = ("device", "host", *DEVICE, *HOST)


@dataclass(frozen=True)
class TierModel:
    """One state of the tiered cache's ownership."""

    device: Int
    host: Int
    d_refs: Arr
    d_free: Arr
    d_req: Arr
    d_cached: Arr
    d_copy: Arr
    d_lease: Arr
    h_refs: Arr
    h_free: Arr
    h_cached: Arr
    h_copy: Arr


def state(name: str) -> TierModel:
    arrays = {field: z3.Array(f"{name}.{field}", z3.IntSort(), z3.IntSort()) for field in (*DEVICE, *HOST)}
    return TierModel(z3.Int(f"{name}.device"), z3.Int(f"{name}.host"), **arrays)


def _on_device(x: TierModel, p: Int) -> Bool:
    return z3.And(p >= 0, p < x.device)


def _on_host(x: TierModel, h: Int) -> Bool:
    return z3.And(h >= 0, h < x.host)


def invariant(x: TierModel, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size), or over `BOUND` pages of each tier."""

    def once_if_free(refs: Int, free: Int) -> Bool:
        return free == z3.If(refs == 0, 1, 0)

    def device_page(p: Int) -> Bool:
        holders = x.d_req[p] + x.d_cached[p] + x.d_copy[p] + x.d_lease[p]
        counted = z3.And(x.d_req[p] >= 0, x.d_cached[p] >= 0, x.d_cached[p] <= 1, x.d_copy[p] >= 0, x.d_lease[p] >= 0)
        return z3.Implies(
            _on_device(x, p), z3.And(counted, x.d_refs[p] == holders, once_if_free(x.d_refs[p], x.d_free[p]))
        )

    def host_page(h: Int) -> Bool:
        counted = z3.And(x.h_cached[h] >= 0, x.h_cached[h] <= 1, x.h_copy[h] >= 0)
        holders = x.h_cached[h] + x.h_copy[h]
        return z3.Implies(
            _on_host(x, h), z3.And(counted, x.h_refs[h] == holders, once_if_free(x.h_refs[h], x.h_free[h]))
        )

    sizes = z3.And(x.device == BOUND, x.host == BOUND) if bounded else z3.And(x.device >= 1, x.host >= 0)
    return z3.And(sizes, every(device_page, "p", range(BOUND), bounded), every(host_page, "h", range(BOUND), bounded))


def _same(x: TierModel, y: TierModel, *changed: str) -> Bool:
    return z3.And(*(getattr(y, name) == getattr(x, name) for name in FIELDS if name not in changed))


def _add(x: TierModel, y: TierModel, field: str, page: Int, delta: int) -> Bool:
    before: Arr = getattr(x, field)
    after: Arr = getattr(y, field)
    return after == z3.Store(before, page, before[page] + delta)


def _count(x: TierModel, y: TierModel, tier: str, page: Int, delta: int) -> Bool:
    """`page`'s count on `tier` ("d" or "h") moves by `delta`; reaching 0 it is pushed on the free
    stack, leaving 0 it is taken off (a free page gains a holder only by `take`)."""
    refs, free = getattr(x, f"{tier}_refs"), getattr(x, f"{tier}_free")
    after = refs[page] + delta
    pushed = z3.If(z3.And(after == 0, refs[page] != 0), 1, 0)
    popped = z3.If(z3.And(after != 0, refs[page] == 0), -1, 0)
    return z3.And(
        getattr(y, f"{tier}_refs") == z3.Store(refs, page, after),
        getattr(y, f"{tier}_free") == z3.Store(free, page, free[page] + pushed + popped),
    )


def take(x: TierModel, y: TierModel, p: Int, *, free_only: bool = True) -> Bool:
    """A free device page is handed to a request (`free_only` False: any page no request holds)."""
    guard = x.d_free[p] == 1 if free_only else x.d_req[p] == 0
    return z3.And(
        _on_device(x, p),
        guard,
        y.d_refs == z3.Store(x.d_refs, p, 1),
        y.d_free == z3.Store(x.d_free, p, 0),
        y.d_req == z3.Store(x.d_req, p, 1),
        _same(x, y, "d_refs", "d_free", "d_req"),
    )


def attach(x: TierModel, y: TierModel, p: Int) -> Bool:
    return z3.And(
        _on_device(x, p),
        x.d_cached[p] == 1,
        _add(x, y, "d_req", p, 1),
        _count(x, y, "d", p, 1),
        _same(x, y, "d_req", "d_refs", "d_free"),
    )


def release(x: TierModel, y: TierModel, p: Int, *, lease_too: bool = False, times: int = 1) -> Bool:
    """A request lets go of `p` (`lease_too`: and of the page's leases, as if they were its;
    `times`: counted that many times)."""
    leases = y.d_lease == z3.Store(x.d_lease, p, 0) if lease_too else y.d_lease == x.d_lease
    return z3.And(
        _on_device(x, p),
        x.d_req[p] > 0,
        _add(x, y, "d_req", p, -1),
        leases,
        _count(x, y, "d", p, -times),
        _same(x, y, "d_req", "d_lease", "d_refs", "d_free"),
    )


def cache(x: TierModel, y: TierModel, p: Int) -> Bool:
    return z3.And(
        _on_device(x, p),
        x.d_req[p] > 0,
        x.d_cached[p] == 0,
        y.d_cached == z3.Store(x.d_cached, p, 1),
        _count(x, y, "d", p, 1),
        _same(x, y, "d_cached", "d_refs", "d_free"),
    )


def evict(x: TierModel, y: TierModel, p: Int) -> Bool:
    return z3.And(
        _on_device(x, p),
        x.d_cached[p] == 1,
        x.d_refs[p] == 1,
        y.d_cached == z3.Store(x.d_cached, p, 0),
        _count(x, y, "d", p, -1),
        _same(x, y, "d_cached", "d_refs", "d_free"),
    )


def lease(x: TierModel, y: TierModel, p: Int) -> Bool:
    return z3.And(
        _on_device(x, p),
        x.d_refs[p] > 0,
        _add(x, y, "d_lease", p, 1),
        _count(x, y, "d", p, 1),
        _same(x, y, "d_lease", "d_refs", "d_free"),
    )


def end_lease(x: TierModel, y: TierModel, p: Int) -> Bool:
    return z3.And(
        _on_device(x, p),
        x.d_lease[p] > 0,
        _add(x, y, "d_lease", p, -1),
        _count(x, y, "d", p, -1),
        _same(x, y, "d_lease", "d_refs", "d_free"),
    )


def demote(x: TierModel, y: TierModel, p: Int, h: Int) -> Bool:
    """Cached device page `p` is copied into free host page `h`; the copy holds both."""
    return z3.And(
        _on_device(x, p),
        _on_host(x, h),
        x.d_cached[p] == 1,
        x.h_free[h] == 1,
        _add(x, y, "d_copy", p, 1),
        _count(x, y, "d", p, 1),
        y.h_refs == z3.Store(x.h_refs, h, 1),
        y.h_free == z3.Store(x.h_free, h, 0),
        _add(x, y, "h_copy", h, 1),
        _same(x, y, "d_copy", "d_refs", "d_free", "h_refs", "h_free", "h_copy"),
    )


def demoted(x: TierModel, y: TierModel, p: Int, h: Int, *, ok: bool, device_hold_ends: bool = True) -> Bool:
    """The demotion holding `p` and `h` completes (`ok`: the host cache takes its hold on `h`) or
    fails; it lets go of `p` (`device_hold_ends` False: the copy is gone but its count stays)."""
    host = (
        z3.And(y.h_cached == z3.Store(x.h_cached, h, 1), y.h_refs == x.h_refs, y.h_free == x.h_free)
        if ok
        else z3.And(y.h_cached == x.h_cached, _count(x, y, "h", h, -1))
    )
    device = (
        z3.And(_add(x, y, "d_copy", p, -1), _count(x, y, "d", p, -1))
        if device_hold_ends
        else z3.And(_add(x, y, "d_copy", p, -1), y.d_refs == x.d_refs, y.d_free == x.d_free)
    )
    return z3.And(
        _on_device(x, p),
        _on_host(x, h),
        x.d_copy[p] > 0,
        x.h_copy[h] > 0,
        x.h_cached[h] == 0,
        _add(x, y, "h_copy", h, -1),
        host,
        device,
        _same(x, y, "h_copy", "h_cached", "h_refs", "h_free", "d_copy", "d_refs", "d_free"),
    )


def promote(x: TierModel, y: TierModel, p: Int, h: Int) -> Bool:
    """Cached host page `h` is copied into device page `p`, a request's fresh page; the copy holds both."""
    return z3.And(
        _on_device(x, p),
        _on_host(x, h),
        x.d_req[p] == 1,
        x.d_cached[p] == 0,
        x.h_cached[h] == 1,
        _add(x, y, "d_copy", p, 1),
        _count(x, y, "d", p, 1),
        _add(x, y, "h_copy", h, 1),
        _count(x, y, "h", h, 1),
        _same(x, y, "d_copy", "d_refs", "d_free", "h_copy", "h_refs", "h_free"),
    )


def promoted(x: TierModel, y: TierModel, p: Int, h: Int, *, ok: bool) -> Bool:
    """The promotion holding `p` and `h` completes (`ok`: the device cache takes its hold on `p`,
    unless `p` is cached already) or fails; it lets go of `h`."""
    takes = x.d_cached[p] == 0 if ok else z3.BoolVal(False)
    device = z3.If(
        takes,
        z3.And(y.d_cached == z3.Store(x.d_cached, p, 1), y.d_refs == x.d_refs, y.d_free == x.d_free),
        z3.And(y.d_cached == x.d_cached, _count(x, y, "d", p, -1)),
    )
    return z3.And(
        _on_device(x, p),
        _on_host(x, h),
        x.d_copy[p] > 0,
        x.h_copy[h] > 0,
        _add(x, y, "d_copy", p, -1),
        device,
        _add(x, y, "h_copy", h, -1),
        _count(x, y, "h", h, -1),
        _same(x, y, "d_copy", "d_cached", "d_refs", "d_free", "h_copy", "h_refs", "h_free"),
    )


def host_evict(x: TierModel, y: TierModel, h: Int, *, only_cached: bool = True) -> Bool:
    """A cached host page only the host cache holds leaves it, and is free (`only_cached` False:
    the page is reclaimed, free, whoever else holds it)."""
    if only_cached:
        reclaimed = z3.And(x.h_refs[h] == 1, _count(x, y, "h", h, -1))
    else:
        reclaimed = z3.And(y.h_refs == z3.Store(x.h_refs, h, 0), y.h_free == z3.Store(x.h_free, h, 1))
    return z3.And(
        _on_host(x, h),
        x.h_cached[h] == 1,
        y.h_cached == z3.Store(x.h_cached, h, 0),
        reclaimed,
        _same(x, y, "h_cached", "h_refs", "h_free"),
    )


Transition = Callable[[TierModel, TierModel], Bool]


def transitions() -> dict[str, Transition]:
    """Every transition (device page `p`, host page `h` free variables); each event of the tiered
    cache registers the transitions it is made of."""
    p, h = z3.Ints("p h")
    steps: dict[str, Transition] = {
        "take": lambda x, y: take(x, y, p),
        "attach": lambda x, y: attach(x, y, p),
        "release": lambda x, y: release(x, y, p),
        "cache": lambda x, y: cache(x, y, p),
        "evict": lambda x, y: evict(x, y, p),
        "lease": lambda x, y: lease(x, y, p),
        "end_lease": lambda x, y: end_lease(x, y, p),
        "demote": lambda x, y: demote(x, y, p, h),
        "demoted": lambda x, y: demoted(x, y, p, h, ok=True),
        "demote_failed": lambda x, y: demoted(x, y, p, h, ok=False),
        "promote": lambda x, y: promote(x, y, p, h),
        "promoted": lambda x, y: promoted(x, y, p, h, ok=True),
        "promote_failed": lambda x, y: promoted(x, y, p, h, ok=False),
        "host_evict": lambda x, y: host_evict(x, y, h),
    }
    return steps


def broken() -> dict[str, Transition]:
    """The broken forms that must be refuted."""
    p, h = z3.Ints("p h")
    return {
        "release_lets_go_of_the_lease": lambda x, y: release(x, y, p, lease_too=True),
        "take_a_page_that_is_not_free": lambda x, y: take(x, y, p, free_only=False),
        "host_evict_under_a_copy": lambda x, y: host_evict(x, y, h, only_cached=False),
        "release_counted_twice": lambda x, y: release(x, y, p, times=2),
        "demoted_keeps_the_device_hold": lambda x, y: demoted(x, y, p, h, ok=True, device_hold_ends=False),
    }


def _within_bound() -> Bool:
    p, h = z3.Ints("p h")
    return z3.And(p >= 0, p < BOUND, h >= 0, h < BOUND)


# -- the model tied to the spec's invariants -------------------------------------------------


def encode(concrete: TierState) -> TierModel:
    """A concrete tiered cache as a ground model state (ground for any state, corrupted or not)."""
    zero = z3.K(z3.IntSort(), z3.IntVal(0))
    arrays = dict.fromkeys((*DEVICE, *HOST), zero)

    def bump(field: str, page: int, by: int = 1) -> None:
        arrays[field] = z3.Store(arrays[field], page, z3.simplify(arrays[field][page] + by))

    for tier, prefix in ((concrete.device, "d"), (concrete.host, "h")):
        for page, count in enumerate(tier.refs):
            arrays[f"{prefix}_refs"] = z3.Store(arrays[f"{prefix}_refs"], page, count)
        for page in tier.free:
            bump(f"{prefix}_free", page)
        for entry in tier.cache:
            bump(f"{prefix}_cached", entry.page)
    for held in concrete.requests:
        for page in held.pages:
            bump("d_req", page)
    for transfer in concrete.transfers:
        bump("d_copy", transfer.page)
        bump("h_copy", transfer.host_page)
    for held_lease in concrete.leases:
        bump("d_lease", held_lease.page)
    sizes = (z3.IntVal(len(concrete.device.refs)), z3.IntVal(len(concrete.host.refs)))
    return TierModel(*sizes, **arrays)


CARRIED = (counts_are_holders, free_is_unheld)
"""The spec invariants the model's invariant carries (the content ones are the explorer's)."""


def holds(concrete: TierState) -> bool:
    """The model's invariant (every size) on the encoded state, decided by z3 within its resource
    units (never a clock)."""
    return invariant_holds(invariant(encode(concrete)), RESOURCE_LIMIT, f"the tiers' invariant on {concrete}")


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


def main() -> int:
    """Prove every transition, refute every broken form; 0 when all is as it must be."""
    return 0 if MODEL.report("tiers", 32, transitions(), broken()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
