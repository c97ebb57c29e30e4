"""The host tier in the engine: promotions into an admission's pages, and the copies the model
reports done.

    promote          issue a newcomer's planned promotion (`Promotion`) at the commit: copy host
                     pages into its fresh pages (each held by its copy); the request waits,
                     computing nothing, until every copy completes
    complete_copies  apply the copies the model reported at the step's start, once its model
                     calls succeeded (the commit), in issue order: a promotion that completed
                     joins the device cache and its request waits for one copy fewer; one that
                     failed preempts its request (it recomputes)
    readable         a running request whose written pages all hold their KV (it waits for no
                     copy): what `publish` and `lease` read

The tier's state is `work.host` (`kvsched.spec.host_tier`: demotions, a failing tier, the free
stack); a copy in flight holds its device page in the pool (the system's `external` holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvsched.spec import host_tier, refusals
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.engine_running import preempt
from kvsched.spec.engine_state import Running, victim_order
from kvsched.spec.engine_work import Work
from kvsched.spec.host_tier import PROMOTE


@dataclass(frozen=True, slots=True)
class Promotion:
    """A newcomer's host run, planned at its admission and issued at the commit: its request,
    the host pages to copy, and the logical page the first of them goes to."""

    request_id: int
    fetch: tuple[host_tier.HostPage, ...]
    first: int


def promote(work: Work, promotion: Promotion) -> None:
    """Issue `promotion`: copy its host pages into its request's fresh pages from its first
    logical page (each held by its copy); the request waits for those copies."""
    request_id = promotion.request_id
    table = work.scheduler.page_table(request_id)
    waiting = []
    for depth, entry in enumerate(promotion.fetch, start=promotion.first):
        page = table[depth]
        assert page is not None
        work.pool.retain(page)  # the copy's hold
        work.host, transfer_id = host_tier.promote(work.host, entry, page, request_id)
        waiting.append(transfer_id)
    work.host = host_tier.count_hit(work.host, len(promotion.fetch) * work.config.page_size)
    work.replace(work.entry(request_id), waiting=tuple(waiting))


def complete_copies(work: Work, done: Mapping[int, bool], preempted: list[int]) -> None:
    """Apply the copies `done` reports (see `kvsched.spec.host_tier`), in issue order; a request
    whose promotion failed is preempted (appended to `preempted`), the latest first."""
    failed: list[int] = []
    for copy in work.host.copies:
        ok = done.get(copy.transfer_id)
        if ok is None:
            continue
        if copy.kind == PROMOTE and ok:
            work.cache, pool = cache_ops.insert(
                work.cache, work.pool.state, copy.key, copy.page, copy.depth, copy.parent
            )
            work.pool.commit(pool)
        work.pool.release(copy.page)
        work.host = host_tier.complete(work.host, copy, ok)
        entry = _waiting_on(work, copy.request_id, copy.transfer_id)
        if entry is not None and ok:
            work.replace(entry, waiting=tuple(tid for tid in entry.waiting if tid != copy.transfer_id))
        elif entry is not None and copy.request_id not in failed:
            failed.append(entry.request.request_id)
    for entry in sorted(map(work.entry, failed), key=victim_order):  # the latest first: places kept
        preempt(work, entry, preempted)


def _waiting_on(work: Work, request_id: int | None, transfer_id: int) -> Running | None:
    """The running request waiting for copy `transfer_id`, if any."""
    entry = None if request_id is None else work.find(request_id)
    return entry if entry is not None and transfer_id in entry.waiting else None


def readable(work: Work, request_id: int) -> Running:
    """The running request `request_id`, once every page of its written tokens holds their KV
    (it waits for no copy from the host tier); else `UnknownRequest` or `CopyPending`."""
    entry = work.find(request_id)
    if entry is None:
        raise refusals.unknown_request(request_id)
    if entry.waiting:
        raise refusals.copy_pending(request_id, promoted_page(work, entry))
    return entry


def promoted_page(work: Work, entry: Running) -> int:
    """A page `entry` waits for."""
    return next(copy.page for copy in work.host.copies if copy.transfer_id in entry.waiting)
