"""The engine's host tier: a second pool of pages in host memory, and the copies in flight
between it and the device pool (`EngineConfig.host_pages`).

Modelled: `pages` host pages, a free stack (the last page freed is the next handed out), the
host cache (a page under the key of the chain of tokens its KV holds, least recently used
first), and the copies in flight, each with an id (ids count up from 0, never reused):

    demote    the device cache would evict a page whose key the host lacks (and no demotion of
              that key is in flight): instead its KV is copied to a host page, which comes from
              the free stack, else from the host cache's least recently used page no copy reads.
              The copy holds the device page (it stays cached, but not evictable) until it completes
    promote   an admission's sequence continues, past the pages cached on the device, into host
              pages cached under its next keys: each is copied into a fresh device page the
              request holds, and the request waits (computes nothing) until every copy completes
    complete  the model reports a copy done (ok) or failed: a demotion's host page is cached
              under its key, or freed; a promotion's device page joins the device cache, or,
              failed, is never read (its request is preempted and recomputes) and the host page
              it read leaves the host cache. Either way the copy's holds end

A failing tier degrades, never stalls:
- a device page whose demotion failed is **refused**: while the device cache keeps it, the next
  eviction that chooses it evicts it instead of demoting it again (the engine forgets a refused
  page once the device cache no longer holds it). With every copy failing, each page is tried
  once and then evicted, so the engine makes progress as it would with no host tier;
- a host page a failed copy touched is freed to the **bottom** of the free stack: every other
  free page is handed out before it, so one bad host page is not handed straight back.

A host page is held by its cache entry and by every copy that reads or writes it; it is free
exactly when nothing holds it. A device page is held by every copy in flight on it (the
engine's `SystemState.external`), so **a page under copy is never handed to another owner**,
whatever happens to the request that caused the copy (finish, cancel, preemption): a copy that
completes after its request left writes a page nobody else holds.

Every function is pure: it returns the new `HostState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvsched.spec.page_keys import Key

DEMOTE, PROMOTE = "demote", "promote"


@dataclass(frozen=True, slots=True)
class HostPage:
    """A cached host page: its key, its chain depth (logical page index) and the key of the
    page before it in its chain (None at depth 0)."""

    page: int
    key: Key
    depth: int
    parent: Key | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """A copy in flight: a demotion (device `page` to `host_page`) or a promotion (`host_page`
    to device `page`, which request `request_id` waits for)."""

    transfer_id: int
    kind: str
    page: int
    host_page: int
    key: Key
    depth: int
    request_id: int | None = None
    parent: Key | None = None  # the key before `key` in its chain


@dataclass(frozen=True, slots=True)
class HostStats:
    """The host tier's counters."""

    hit_tokens: int = 0  # tokens admissions found in the host tier (promoted)
    demoted: int = 0  # demotions issued (pages copied to the host)
    promoted: int = 0  # promotions issued (pages copied to the device)
    failed: int = 0  # copies the model reported failed

    def __sub__(self, other: HostStats) -> HostStats:
        return HostStats(
            self.hit_tokens - other.hit_tokens,
            self.demoted - other.demoted,
            self.promoted - other.promoted,
            self.failed - other.failed,
        )


@dataclass(frozen=True, slots=True)
class HostState:
    """The host tier: its size, free stack (top last), cache (least recently used first),
    copies in flight (issue order), how many copies were issued so far (the next id), counters,
    and the refused device pages (their demotion failed; in order of failure)."""

    pages: int = 0
    free: tuple[int, ...] = ()
    cache: tuple[HostPage, ...] = ()
    copies: tuple[Copy, ...] = ()
    issued: int = 0
    stats: HostStats = field(default_factory=HostStats)
    refused: tuple[int, ...] = ()


NO_HOST = HostState()


def initial_host(pages: int) -> HostState:
    """`pages` free host pages; the first handed out is page 0."""
    return HostState(pages, tuple(reversed(range(pages))))


# -- reading ------------------------------------------------------------------------------------


def find(host: HostState, key: Key) -> HostPage | None:
    """The host page cached under `key`, if any."""
    return next((entry for entry in host.cache if entry.key == key), None)


def run(host: HostState, keys: Sequence[Key]) -> tuple[HostPage, ...]:
    """The host pages cached under `keys[0]`, `keys[1]`, ... up to the first key not cached."""
    found = []
    for key in keys:
        entry = find(host, key)
        if entry is None:
            break
        found.append(entry)
    return tuple(found)


def is_held(host: HostState, page: int) -> bool:
    """A cache entry or a copy in flight holds host `page`."""
    return any(entry.page == page for entry in host.cache) or any(copy.host_page == page for copy in host.copies)


def demoting(host: HostState, key: Key) -> bool:
    """A demotion of `key` is in flight."""
    return any(copy.kind == DEMOTE and copy.key == key for copy in host.copies)


def wants(host: HostState, page: int, key: Key) -> bool:
    """Device `page`, cached under `key`, would be demoted rather than evicted: the host has room
    (a free page or a cached one no copy reads), lacks the key and is not already copying it,
    and the page is not refused (its demotion failed)."""
    if not host.pages or page in host.refused or find(host, key) is not None or demoting(host, key):
        return False
    return bool(host.free) or any(not _read(host, entry.page) for entry in host.cache)


def device_holds(host: HostState) -> tuple[int, ...]:
    """The device pages the copies in flight hold, one per copy, sorted."""
    return tuple(sorted(copy.page for copy in host.copies))


# -- changing -----------------------------------------------------------------------------------


def demote(host: HostState, page: int, key: Key, depth: int, parent: Key | None = None) -> HostState:
    """Copy device `page` (cached under `key`, after `parent`) to a host page (`wants(host, key)` holds)."""
    host, host_page = _take(host)
    copy = Copy(host.issued, DEMOTE, page, host_page, key, depth, parent=parent)
    stats = replace(host.stats, demoted=host.stats.demoted + 1)
    return replace(host, copies=(*host.copies, copy), issued=host.issued + 1, stats=stats)


def promote(host: HostState, entry: HostPage, page: int, request_id: int) -> tuple[HostState, int]:
    """Copy the cached host page `entry` into device `page`, for `request_id`; the copy's id.
    The entry becomes the most recently used."""
    copy = Copy(host.issued, PROMOTE, page, entry.page, entry.key, entry.depth, request_id, entry.parent)
    cache = (*(other for other in host.cache if other != entry), entry)
    stats = replace(host.stats, promoted=host.stats.promoted + 1)
    return replace(
        host, cache=cache, copies=(*host.copies, copy), issued=host.issued + 1, stats=stats
    ), copy.transfer_id


def count_hit(host: HostState, tokens: int) -> HostState:
    """An admission found `tokens` tokens in the host tier."""
    return replace(host, stats=replace(host.stats, hit_tokens=host.stats.hit_tokens + tokens))


def complete(host: HostState, copy: Copy, ok: bool) -> HostState:
    """`copy` completed (`ok`) or failed; its host page is cached (a demotion that completed),
    dropped from the cache (a promotion that failed: what it read is suspect) or kept, and freed
    once nothing holds it: to the top of the free stack, or, after a failure, to the bottom. A
    failed demotion's device page is refused."""
    host = replace(host, copies=tuple(other for other in host.copies if other.transfer_id != copy.transfer_id))
    if copy.kind == DEMOTE and ok:
        host = replace(host, cache=(*host.cache, HostPage(copy.host_page, copy.key, copy.depth, copy.parent)))
    if copy.kind == DEMOTE and not ok:
        host = replace(host, refused=(*host.refused, copy.page))
    if copy.kind == PROMOTE and not ok:
        host = replace(host, cache=tuple(entry for entry in host.cache if entry.page != copy.host_page))
    if not ok:
        host = replace(host, stats=replace(host.stats, failed=host.stats.failed + 1))
    if is_held(host, copy.host_page):
        return host
    free = (*host.free, copy.host_page) if ok else (copy.host_page, *host.free)
    return replace(host, free=free)


def keep_refused(host: HostState, cached: frozenset[int] | set[int]) -> HostState:
    """Forget the refused pages the device cache no longer holds (`cached`: the pages it holds)."""
    if all(page in cached for page in host.refused):
        return host
    return replace(host, refused=tuple(page for page in host.refused if page in cached))


def reset(host: HostState) -> HostState:
    """Drop every cached host page (no copy is in flight), least recently used freed first; the
    device cache is dropped too, so no page is refused."""
    free = host.free + tuple(entry.page for entry in host.cache)
    return replace(host, free=free, cache=(), refused=())


def _read(host: HostState, page: int) -> bool:
    return any(copy.host_page == page for copy in host.copies)


def _take(host: HostState) -> tuple[HostState, int]:
    """A host page for a demotion: the free stack's top, else the least recently used cached
    page no copy reads (it leaves the cache)."""
    if host.free:
        return replace(host, free=host.free[:-1]), host.free[-1]
    entry = next(entry for entry in host.cache if not _read(host, entry.page))
    return replace(host, cache=tuple(other for other in host.cache if other is not entry)), entry.page


# -- invariants -------------------------------------------------------------------------------


def inv_host_pages_exact(host: HostState) -> bool:
    """A host page is on the free stack iff nothing holds it, at most once; every page named is
    in range; free + held = total."""
    named = [entry.page for entry in host.cache] + [copy.host_page for copy in host.copies] + list(host.free)
    in_range = all(0 <= page < host.pages for page in named)
    held = {entry.page for entry in host.cache} | {copy.host_page for copy in host.copies}
    free = set(host.free)
    exact = len(free) == len(host.free) and not free & held and len(free | held) == host.pages
    return in_range and exact


def inv_host_cache_well_formed(host: HostState) -> bool:
    """Each cached host page holds one key and each key one page; no page a demotion is still
    writing is cached (it is cached when the copy completes)."""
    pages = [entry.page for entry in host.cache]
    keys = [entry.key for entry in host.cache]
    writing = {copy.host_page for copy in host.copies if copy.kind == DEMOTE}
    return len(set(pages)) == len(pages) and len(set(keys)) == len(keys) and not writing & set(pages)


def inv_host_refused_distinct(host: HostState) -> bool:
    """Each refused device page is named once, and no demotion of it is in flight."""
    demoting_pages = {copy.page for copy in host.copies if copy.kind == DEMOTE}
    return len(set(host.refused)) == len(host.refused) and not demoting_pages & set(host.refused)


def inv_host_copies_well_formed(host: HostState) -> bool:
    """Copies in flight are in issue order with ids below `issued`; a promotion reads a page the
    host caches under its key (or one a failure already dropped: never a page a demotion
    writes), and names its request; a host page is written by at most one demotion."""
    ids = [copy.transfer_id for copy in host.copies]
    ordered = ids == sorted(set(ids)) and all(0 <= tid < host.issued for tid in ids)
    demoted = [copy.host_page for copy in host.copies if copy.kind == DEMOTE]
    cached = {entry.page: entry.key for entry in host.cache}
    promotions = all(
        copy.request_id is not None
        and copy.host_page not in demoted
        and cached.get(copy.host_page, copy.key) == copy.key
        for copy in host.copies
        if copy.kind == PROMOTE
    )
    kinds = all(copy.kind in (DEMOTE, PROMOTE) for copy in host.copies)
    return ordered and len(set(demoted)) == len(demoted) and promotions and kinds
