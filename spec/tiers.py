"""The tiered cache: device pages and host pages, copies between them in flight, leases, and
admission in two phases.

Modelled, for each tier, a fixed set of pages with a reference count each, a free stack (the
last page freed is the next handed out) and a cache of pages under keys (a key names the chain
of tokens whose KV a page holds; one page per key, one key per page, least recently used first). Every
owner holds one reference: on a device page, a request that holds it, the device cache, each
copy in flight that reads or writes it, each lease; on a host page, the host cache and each copy
in flight. A page is free exactly when nobody holds it, so **a page under lease is never handed
to another owner**, whatever happens to the request that caused the lease; it is free again when
its last holder lets go.

The content of every page is kept as a ghost (`device_content`, `host_content`): the key whose
KV it holds, or None while no one has written it since it was handed out. What a caller reads
(`compute`, `end_lease`) is returned, so a check can say whether it was what it should be.

    lookup    the longest run of a sequence's keys cached on the device, then the run that
              continues in the host cache (no change)
    commit    admit a request of keys with what a lookup found, validated again now: the
              device run still cached under the same keys is attached (retained), the host run
              after it, still cached, is promoted (a copy per page into a fresh device page the
              request holds, issued now, completed later), every other page is fresh. Fresh
              pages come from the free stack, then from evicting cached pages only the cache
              holds, least recently used first; short of pages, `Exhausted` and nothing changes
    compute   the request's forward pass: reads every written page of its (returned, position
              and content), writes the rest with their keys, caches each page whose key is not
              cached yet; refused (`CopyPending`) while a copy into one of its pages is in flight
    free      the request lets go of its pages (a finish, a cancel, a preemption); its cached
              pages become the most recently used; a copy in flight keeps its page
    demote    copy up to `n` cached device pages whose keys the host lacks (least recently used
              first) into host pages (from the host's free stack, then evicting host pages only
              the host cache holds, least recently used first); each copy holds its device page
              and its host page until it completes
    complete  a copy completes (`ok`) or fails: a demotion's host page is cached under its key;
              a promotion's device page gets the host page's content and is cached under its
              key; either way its holds end. A failed copy writes nothing: a failed promotion's
              page stays unwritten, and the request's next `compute` writes it
    lease     an asynchronous reader (a disaggregated send, a connector's save) holds a written
              device page; `end_lease` reads it (returned) and lets go

Every transition is a pure function of the state that returns the new state and its result, or
raises with nothing changed; `TieredCache` stores the current state. `TIER_INVARIANTS` are the
predicates every reachable state satisfies.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from kvsched.spec import refusals
from kvsched.spec.domain import require_int, require_size
from kvsched.spec.pool import MAX_PAGES

Key = Hashable
R = TypeVar("R")
DEMOTE, PROMOTE = "demote", "promote"


@dataclass(frozen=True, slots=True)
class Cached:
    """A cached page and its key."""

    page: int
    key: Key


@dataclass(frozen=True, slots=True)
class Holding:
    """A request's pages, one per key of its sequence, in order."""

    request_id: int
    keys: tuple[Key, ...]
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    """A copy in flight: a demotion (device page to host page) or a promotion (host to device)."""

    transfer_id: int
    kind: str
    page: int
    host_page: int
    key: Key


@dataclass(frozen=True, slots=True)
class Lease:
    """An asynchronous reader's hold on a device page, and the content it saw when it began."""

    lease_id: int
    page: int
    content: Key


@dataclass(frozen=True, slots=True)
class Match:
    """What a lookup found: the device run and the host run after it, each `(key, page)`."""

    device: tuple[tuple[Key, int], ...] = ()
    host: tuple[tuple[Key, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a commit attached: device pages found, host pages promoted (their copies' ids)."""

    device_hits: int
    host_hits: int
    transfers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier's pages: counts, the free stack (top last), content, and its cache, least
    recently used first."""

    refs: tuple[int, ...]
    free: tuple[int, ...]
    content: tuple[Key | None, ...]
    cache: tuple[Cached, ...] = ()


@dataclass(frozen=True, slots=True)
class TierState:
    """Both tiers, the requests by id, copies and leases by id (an id is the least one no copy
    or lease has now)."""

    device: Tier
    host: Tier
    requests: tuple[Holding, ...] = ()
    transfers: tuple[Transfer, ...] = ()
    leases: tuple[Lease, ...] = ()


def empty_tier(pages: int) -> Tier:
    """`pages` free pages; the first handed out is page 0."""
    return Tier((0,) * pages, tuple(reversed(range(pages))), (None,) * pages)


def initial_tiers(device_pages: int, host_pages: int) -> TierState:
    device_pages = require_size("device_pages", device_pages, 1, MAX_PAGES)
    host_pages = require_size("host_pages", host_pages, 0, MAX_PAGES)
    return TierState(empty_tier(device_pages), empty_tier(host_pages))


# -- reading a tier ------------------------------------------------------------------------------


def cached_page(tier: Tier, key: Key) -> int | None:
    """The page cached under `key`, if any."""
    return next((entry.page for entry in tier.cache if entry.key == key), None)


def cache_entry(tier: Tier, page: int) -> Cached | None:
    return next((entry for entry in tier.cache if entry.page == page), None)


def evictable(tier: Tier) -> list[Cached]:
    """Cached pages only the cache holds, least recently used first (ties: the lower page)."""
    return [e for e in tier.cache if tier.refs[e.page] == 1]


def holding(state: TierState, request_id: int) -> Holding | None:
    return next((held for held in state.requests if held.request_id == request_id), None)


def incoming(state: TierState, page: int) -> Transfer | None:
    """The promotion writing device `page`, if one is in flight."""
    return next((t for t in state.transfers if t.kind == PROMOTE and t.page == page), None)


# -- changing a tier (pure; each returns the new tier) ---------------------------------------------


def _retain(tier: Tier, page: int) -> Tier:
    refs = list(tier.refs)
    refs[page] += 1
    free = tier.free if tier.refs[page] else tuple(p for p in tier.free if p != page)
    return replace(tier, refs=tuple(refs), free=free)


def _release(tier: Tier, page: int) -> Tier:
    refs = list(tier.refs)
    refs[page] -= 1
    free = tier.free + (page,) if refs[page] == 0 else tier.free
    return replace(tier, refs=tuple(refs), free=free)


def _cache(tier: Tier, page: int, key: Key) -> Tier:
    """Cache `page` under `key`, the most recently used (the cache takes a reference)."""
    return _retain(replace(tier, cache=(*tier.cache, Cached(page, key))), page)


def _uncache(tier: Tier, page: int) -> Tier:
    """Drop `page`'s cache entry and the cache's reference."""
    return _release(replace(tier, cache=tuple(e for e in tier.cache if e.page != page)), page)


def _use(tier: Tier, pages: Iterable[int]) -> Tier:
    """The cached ones of `pages` become the most recently used, in the order given."""
    order = [page for page in pages if cache_entry(tier, page) is not None]
    used = tuple(e for page in order for e in tier.cache if e.page == page)
    return replace(tier, cache=tuple(e for e in tier.cache if e.page not in order) + used)


def _by_id(transfers: Iterable[Transfer]) -> tuple[Transfer, ...]:
    return tuple(sorted(transfers, key=lambda t: t.transfer_id))


def _next_id(state: TierState, issued: Iterable[int] = ()) -> int:
    """The least id no copy or lease has (nor one of `issued`)."""
    taken = {t.transfer_id for t in state.transfers} | {lease.lease_id for lease in state.leases} | set(issued)
    return next(n for n in range(len(taken) + 1) if n not in taken)


def _write(tier: Tier, page: int, content: Key | None) -> Tier:
    contents = list(tier.content)
    contents[page] = content
    return replace(tier, content=tuple(contents))


def _take(tier: Tier, count: int) -> tuple[Tier, list[int]]:
    """`count` fresh pages, each held once and unwritten: from the free stack, then evicting the
    least recently used page only the cache holds. Short of pages: `Exhausted`."""
    available = len(tier.free) + len(evictable(tier))
    if available < count:
        raise refusals.not_enough_free(count, available)
    taken: list[int] = []
    for _ in range(count):
        if not tier.free:
            tier = _uncache(tier, evictable(tier)[0].page)
        page = tier.free[-1]
        tier = _write(_retain(tier, page), page, None)
        taken.append(page)
    return tier, taken


# -- the transitions -------------------------------------------------------------------------------


def require_keys(keys: object) -> tuple[Key, ...]:
    """A sequence's keys: a non-empty tuple of distinct hashable values, none of them None."""
    if not isinstance(keys, tuple) or not keys:
        raise refusals.wrong_kind("keys", "a non-empty tuple of keys", keys)
    for key in keys:
        if key is None or not isinstance(key, Hashable):
            raise refusals.wrong_kind("key", "a hashable value other than None", key)
    if len(set(keys)) != len(keys):
        raise refusals.repeated_key(keys)
    return keys


def lookup(state: TierState, keys: object) -> Match:
    """The device run of `keys` from the start, then the host run that continues it."""
    chosen = require_keys(keys)
    device: list[tuple[Key, int]] = []
    host: list[tuple[Key, int]] = []
    for key in chosen:
        page = cached_page(state.device, key)
        if page is None:
            break
        device.append((key, page))
    for key in chosen[len(device) :]:
        host_page = cached_page(state.host, key)
        if host_page is None:
            break
        host.append((key, host_page))
    return Match(tuple(device), tuple(host))


def require_match(match: object, keys: tuple[Key, ...]) -> Match:
    """What a lookup of `keys` answered (None: nothing), checked for shape, not for being current."""
    if match is None:
        return Match()
    if not isinstance(match, Match):
        raise refusals.wrong_kind("match", "a Match from lookup", match)
    entries = (*match.device, *match.host)
    if not all(isinstance(entry, tuple) and len(entry) == 2 for entry in entries):
        raise refusals.wrong_kind("match", "lookup's answer, (key, page) pairs", match)
    if [key for key, _ in entries] != list(keys[: len(entries)]):
        raise refusals.wrong_kind("match", "lookup's answer for these keys", match)
    for _, page in entries:
        require_int("page", page)
    return match


def commit(state: TierState, request_id: object, keys: object, match: object) -> tuple[TierState, Admitted]:
    """Admit `request_id` over `keys`, with what `match` found that still holds (see above)."""
    rid = require_int("request id", request_id)
    chosen = require_keys(keys)
    found = require_match(match, chosen)
    if holding(state, rid) is not None:
        raise refusals.duplicate_request(rid)
    device, host = state.device, state.host
    hits: list[int] = []
    for key, page in found.device:
        if cached_page(device, key) != page:
            break  # evicted, perhaps reused, since the lookup: the run ends here
        hits.append(page)
    sources: list[tuple[Key, int]] = []
    if len(hits) == len(found.device):
        for key, host_page in found.host:
            if cached_page(host, key) != host_page:
                break
            sources.append((key, host_page))
    for page in hits:
        device = _retain(device, page)
    device, fresh = _take(device, len(chosen) - len(hits))
    device = _use(device, hits)
    host = _use(host, (h for _, h in sources))
    transfers = list(state.transfers)
    ids: list[int] = []
    for (key, host_page), page in zip(sources, fresh, strict=False):
        device, host = _retain(device, page), _retain(host, host_page)
        ids.append(_next_id(state, ids))
        transfers.append(Transfer(ids[-1], PROMOTE, page, host_page, key))
    requests = sorted((*state.requests, Holding(rid, chosen, (*hits, *fresh))), key=lambda h: h.request_id)
    after = TierState(device, host, tuple(requests), _by_id(transfers), state.leases)
    return after, Admitted(len(hits), len(sources), tuple(ids))


def compute(state: TierState, request_id: object) -> tuple[TierState, tuple[tuple[int, Key], ...]]:
    """The request's forward pass: what it read (position, content), its pages written and cached."""
    rid = require_int("request id", request_id)
    held = holding(state, rid)
    if held is None:
        raise refusals.unknown_request(rid)
    for page in held.pages:
        if incoming(state, page) is not None:
            raise refusals.copy_pending(rid, page)
    device = state.device
    reads: list[tuple[int, Key]] = []
    for position, (key, page) in enumerate(zip(held.keys, held.pages, strict=True)):
        content = device.content[page]
        if content is None:
            device = _write(device, page, key)
        else:
            reads.append((position, content))
        if cached_page(device, key) is None and cache_entry(device, page) is None:
            device = _cache(device, page, key)
    return replace(state, device=device), tuple(reads)


def free(state: TierState, request_id: object) -> TierState:
    """The request lets go of every page it holds; its cached pages become the most recently used."""
    rid = require_int("request id", request_id)
    held = holding(state, rid)
    if held is None:
        raise refusals.unknown_request(rid)
    device = _use(state.device, held.pages)
    for page in held.pages:
        device = _release(device, page)
    requests = tuple(h for h in state.requests if h.request_id != rid)
    return replace(state, device=device, requests=requests)


def demote(state: TierState, count: object) -> tuple[TierState, tuple[int, ...]]:
    """Copy up to `count` cached device pages the host lacks into host pages; the copies' ids."""
    n = require_int("count", count)
    if n < 0:
        raise refusals.wrong_kind("count", "a count of at least 0", count)
    moving = {t.key for t in state.transfers}
    candidates = [e for e in state.device.cache if cached_page(state.host, e.key) is None and e.key not in moving]
    device, host = state.device, state.host
    transfers, ids = list(state.transfers), list[int]()
    for entry in candidates[:n]:
        if not host.free and not evictable(host):
            break
        host, (host_page,) = _take(host, 1)  # held once: the copy's hold
        device = _retain(device, entry.page)
        ids.append(_next_id(state, ids))
        transfers.append(Transfer(ids[-1], DEMOTE, entry.page, host_page, entry.key))
    return replace(state, device=device, host=host, transfers=_by_id(transfers)), tuple(ids)


def complete(state: TierState, transfer_id: object, ok: object) -> TierState:
    """Copy `transfer_id` completes (`ok`) or fails; its holds end (see above)."""
    tid = require_int("transfer id", transfer_id)
    if not isinstance(ok, bool):
        raise refusals.wrong_kind("ok", "a bool", ok)
    transfer = next((t for t in state.transfers if t.transfer_id == tid), None)
    if transfer is None:
        raise refusals.unknown_transfer(tid)
    device, host = state.device, state.host
    if ok and transfer.kind == DEMOTE:
        host = _write(host, transfer.host_page, device.content[transfer.page])
        if cached_page(host, transfer.key) is None:
            host = _cache(host, transfer.host_page, transfer.key)
    elif ok:
        device = _write(device, transfer.page, host.content[transfer.host_page])
        if cached_page(device, transfer.key) is None and cache_entry(device, transfer.page) is None:
            device = _cache(device, transfer.page, transfer.key)
    device, host = _release(device, transfer.page), _release(host, transfer.host_page)
    transfers = tuple(t for t in state.transfers if t.transfer_id != tid)
    return replace(state, device=device, host=host, transfers=transfers)


def lease(state: TierState, page: object) -> tuple[TierState, int]:
    """An asynchronous reader holds written device `page`; the lease's id."""
    p = require_int("page", page)
    if not 0 <= p < len(state.device.refs):
        raise refusals.page_out_of_range(p, len(state.device.refs))
    if state.device.refs[p] == 0:
        raise refusals.retain_free_page(p)
    content = state.device.content[p]
    if content is None or incoming(state, p) is not None:
        raise refusals.not_written(p)
    lid = _next_id(state)
    leases = tuple(sorted((*state.leases, Lease(lid, p, content)), key=lambda lease: lease.lease_id))
    return replace(state, device=_retain(state.device, p), leases=leases), lid


def end_lease(state: TierState, lease_id: object) -> tuple[TierState, Key | None]:
    """The reader reads its page (the content returned) and lets go."""
    lid = require_int("lease id", lease_id)
    held = next((lease for lease in state.leases if lease.lease_id == lid), None)
    if held is None:
        raise refusals.unknown_lease(lid)
    leases = tuple(lease for lease in state.leases if lease.lease_id != lid)
    read = state.device.content[held.page]
    return replace(state, device=_release(state.device, held.page), leases=leases), read


# -- what always holds -------------------------------------------------------------------------------


def _holders(state: TierState) -> tuple[list[int], list[int]]:
    """How many owners hold each device page and each host page."""
    device = [0] * len(state.device.refs)
    host = [0] * len(state.host.refs)
    for held in state.requests:
        for page in held.pages:
            device[page] += 1
    for entry in state.device.cache:
        device[entry.page] += 1
    for entry in state.host.cache:
        host[entry.page] += 1
    for transfer in state.transfers:
        device[transfer.page] += 1
        host[transfer.host_page] += 1
    for held_lease in state.leases:
        device[held_lease.page] += 1
    return device, host


def counts_are_holders(state: TierState) -> bool:
    """Every page's count, on either tier, is its holders: requests, the cache, copies, leases."""
    device, host = _holders(state)
    return list(state.device.refs) == device and list(state.host.refs) == host


def free_is_unheld(state: TierState) -> bool:
    """Each tier's free stack holds every page nobody holds, once, and no other."""
    return all(
        len(set(tier.free)) == len(tier.free) and set(tier.free) == {p for p, n in enumerate(tier.refs) if n == 0}
        for tier in (state.device, state.host)
    )


def cached_pages_hold_their_keys(state: TierState) -> bool:
    """A page cached under key K, on either tier, holds K's content; one page per key, one key per page."""
    return all(
        all(tier.content[e.page] == e.key for e in tier.cache)
        and len({e.key for e in tier.cache}) == len(tier.cache)
        and len({e.page for e in tier.cache}) == len(tier.cache)
        for tier in (state.device, state.host)
    )


def requests_hold_their_keys(state: TierState) -> bool:
    """A request's page holds its key's content, or nothing yet; a page nothing is written in
    belongs to one request alone (only written pages are shared)."""
    content = state.device.content
    unwritten = [page for held in state.requests for page in held.pages if content[page] is None]
    return len(set(unwritten)) == len(unwritten) and all(
        content[page] in (None, key) for held in state.requests for key, page in zip(held.keys, held.pages, strict=True)
    )


def copies_write_unread_pages(state: TierState) -> bool:
    """A copy's destination is unwritten and uncached until it completes, and no page is the
    destination of two copies."""
    destinations = [(t.kind, t.page if t.kind == PROMOTE else t.host_page) for t in state.transfers]
    return len(set(destinations)) == len(destinations) and all(
        (state.device if kind == PROMOTE else state.host).content[page] is None
        and cache_entry(state.device if kind == PROMOTE else state.host, page) is None
        for kind, page in destinations
    )


def leases_hold_written_pages(state: TierState) -> bool:
    """A leased page holds the content its reader saw when the lease began."""
    return all(state.device.content[lease.page] == lease.content for lease in state.leases)


TIER_INVARIANTS = (
    counts_are_holders,
    free_is_unheld,
    cached_pages_hold_their_keys,
    requests_hold_their_keys,
    copies_write_unread_pages,
    leases_hold_written_pages,
)


class TieredCache:
    """The tiered cache as an object: each call runs its transition on the stored state."""

    def __init__(self, device_pages: int, host_pages: int) -> None:
        self.state = initial_tiers(device_pages, host_pages)

    def to_spec(self) -> TierState:
        return self.state

    def _run(self, result: tuple[TierState, R]) -> R:
        self.state = result[0]
        return result[1]

    def lookup(self, keys: object) -> Match:
        return lookup(self.state, keys)

    def commit(self, request_id: object, keys: object, match: object = None) -> Admitted:
        return self._run(commit(self.state, request_id, keys, match))

    def compute(self, request_id: object) -> tuple[tuple[int, Key], ...]:
        return self._run(compute(self.state, request_id))

    def free(self, request_id: object) -> None:
        self.state = free(self.state, request_id)

    def demote(self, count: object) -> tuple[int, ...]:
        return self._run(demote(self.state, count))

    def complete(self, transfer_id: object, ok: object = True) -> None:
        self.state = complete(self.state, transfer_id, ok)

    def lease(self, page: object) -> int:
        return self._run(lease(self.state, page))

    def end_lease(self, lease_id: object) -> Key | None:
        return self._run(end_lease(self.state, lease_id))
