"""The tiered cache (`kvsched.spec.tiers`) over mutable state: lists of counts and contents, a
free stack per tier, each tier's cache as two dicts (key to page, page to its entry), copies and
leases by id.

Every call validates and sizes everything it needs before it changes anything, so a refusal
leaves the state as it was; `to_spec` is the abstraction function to the spec's `TierState`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from kvsched.spec import refusals
from kvsched.spec.domain import require_int, require_size
from kvsched.spec.pool import MAX_PAGES
from kvsched.spec.tiers import (
    DEMOTE,
    PROMOTE,
    Admitted,
    Cached,
    Holding,
    Lease,
    Match,
    Tier,
    TierState,
    Transfer,
    require_keys,
    require_match,
)

Key = Hashable


@dataclass(slots=True)
class Pages:
    """One tier: counts, free stack (top last), contents, and its cache both ways."""

    refs: list[int]
    free: list[int]
    content: list[Key | None]
    page_of: dict[Key, int] = field(default_factory=dict)  # the cache: key to page
    key_of: dict[int, Key] = field(default_factory=dict)  # page to key, least recently used first

    @classmethod
    def empty(cls, pages: int) -> Pages:
        return cls([0] * pages, list(reversed(range(pages))), [None] * pages)

    def retain(self, page: int) -> None:
        if self.refs[page] == 0:
            self.free.remove(page)
        self.refs[page] += 1

    def release(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free.append(page)

    def cache(self, page: int, key: Key) -> None:
        self.page_of[key] = page
        self.key_of[page] = key
        self.retain(page)

    def uncache(self, page: int) -> None:
        del self.page_of[self.key_of.pop(page)]
        self.release(page)

    def use(self, page: int) -> None:
        """A cached `page` becomes the most recently used."""
        key_of = self.key_of
        if page in key_of:
            key_of[page] = key_of.pop(page)

    def evictable(self) -> list[int]:
        """Pages only the cache holds, least recently used first (ties: the lower page)."""
        refs = self.refs
        return [page for page in self.key_of if refs[page] == 1]

    def available(self) -> int:
        return len(self.free) + sum(1 for page in self.key_of if self.refs[page] == 1)

    def take(self, count: int) -> list[int]:
        """`count` fresh pages, held once, unwritten (sized by the caller: `available`)."""
        victims = self.evictable()
        taken = []
        for _ in range(count):
            if not self.free:
                self.uncache(victims.pop(0))
            page = self.free.pop()
            self.refs[page] = 1
            self.content[page] = None
            taken.append(page)
        return taken

    def to_spec(self) -> Tier:
        cache = tuple(Cached(page, key) for page, key in self.key_of.items())
        return Tier(tuple(self.refs), tuple(self.free), tuple(self.content), cache)


class TieredCache:
    """impl's tiered cache; the same API and refusals as the spec's."""

    def __init__(self, device_pages: int, host_pages: int) -> None:
        device_pages = require_size("device_pages", device_pages, 1, MAX_PAGES)
        host_pages = require_size("host_pages", host_pages, 0, MAX_PAGES)
        self.device = Pages.empty(device_pages)
        self.host = Pages.empty(host_pages)
        self.requests: dict[int, Holding] = {}
        self.transfers: dict[int, Transfer] = {}
        self.incoming: dict[int, int] = {}  # device page: the promotion writing it
        self.leases: dict[int, Lease] = {}

    def to_spec(self) -> TierState:
        return TierState(
            self.device.to_spec(),
            self.host.to_spec(),
            tuple(self.requests[rid] for rid in sorted(self.requests)),
            tuple(self.transfers[tid] for tid in sorted(self.transfers)),
            tuple(self.leases[lid] for lid in sorted(self.leases)),
        )

    def _next_id(self) -> int:
        """The least id no copy or lease has."""
        transfers, leases = self.transfers, self.leases
        return next(n for n in range(len(transfers) + len(leases) + 1) if n not in transfers and n not in leases)

    def _issue(self, kind: str, page: int, host_page: int, key: Key) -> int:
        tid = self._next_id()
        self.transfers[tid] = Transfer(tid, kind, page, host_page, key)
        if kind == PROMOTE:
            self.incoming[page] = tid
        return tid

    # -- requests ---------------------------------------------------------------------------------

    def lookup(self, keys: object) -> Match:
        chosen = require_keys(keys)
        device_of, host_of = self.device.page_of, self.host.page_of
        device: list[tuple[Key, int]] = []
        for key in chosen:
            page = device_of.get(key)
            if page is None:
                break
            device.append((key, page))
        host: list[tuple[Key, int]] = []
        for key in chosen[len(device) :]:
            host_page = host_of.get(key)
            if host_page is None:
                break
            host.append((key, host_page))
        return Match(tuple(device), tuple(host))

    def commit(self, request_id: object, keys: object, match: object = None) -> Admitted:
        rid = require_int("request id", request_id)
        chosen = require_keys(keys)
        found = require_match(match, chosen)
        if rid in self.requests:
            raise refusals.duplicate_request(rid)
        device, host = self.device, self.host
        hits = []
        for key, page in found.device:
            if device.page_of.get(key) != page:
                break
            hits.append(page)
        sources = []
        if len(hits) == len(found.device):
            for key, host_page in found.host:
                if host.page_of.get(key) != host_page:
                    break
                sources.append((key, host_page))
        needed = len(chosen) - len(hits)
        available = device.available() - sum(1 for page in hits if device.refs[page] == 1)
        if available < needed:
            raise refusals.not_enough_free(needed, available)
        for page in hits:
            device.retain(page)
        fresh = device.take(needed)
        for page in hits:
            device.use(page)
        for _, host_page in sources:
            host.use(host_page)
        ids = []
        for (key, host_page), page in zip(sources, fresh, strict=False):
            device.retain(page)
            host.retain(host_page)
            ids.append(self._issue(PROMOTE, page, host_page, key))
        self.requests[rid] = Holding(rid, chosen, (*hits, *fresh))
        return Admitted(len(hits), len(sources), tuple(ids))

    def compute(self, request_id: object) -> tuple[tuple[int, Key], ...]:
        rid = require_int("request id", request_id)
        held = self.requests.get(rid)
        if held is None:
            raise refusals.unknown_request(rid)
        for page in held.pages:
            if page in self.incoming:
                raise refusals.copy_pending(rid, page)
        device = self.device
        content = device.content
        reads = []
        for position, (key, page) in enumerate(zip(held.keys, held.pages, strict=True)):
            now = content[page]
            if now is None:
                content[page] = key
            else:
                reads.append((position, now))
            if key not in device.page_of and page not in device.key_of:
                device.cache(page, key)
        return tuple(reads)

    def free(self, request_id: object) -> None:
        rid = require_int("request id", request_id)
        held = self.requests.pop(rid, None)
        if held is None:
            raise refusals.unknown_request(rid)
        for page in held.pages:
            self.device.use(page)
        for page in held.pages:
            self.device.release(page)

    # -- copies -------------------------------------------------------------------------------------

    def demote(self, count: object) -> tuple[int, ...]:
        n = require_int("count", count)
        if n < 0:
            raise refusals.wrong_kind("count", "a count of at least 0", count)
        device, host = self.device, self.host
        moving = {t.key for t in self.transfers.values()}
        candidates = [page for page, key in device.key_of.items() if key not in host.page_of and key not in moving]
        ids = []
        for page in candidates[:n]:
            key = device.key_of[page]
            if not host.available():
                break
            (host_page,) = host.take(1)
            device.retain(page)
            ids.append(self._issue(DEMOTE, page, host_page, key))
        return tuple(ids)

    def complete(self, transfer_id: object, ok: object = True) -> None:
        tid = require_int("transfer id", transfer_id)
        if not isinstance(ok, bool):
            raise refusals.wrong_kind("ok", "a bool", ok)
        transfer = self.transfers.pop(tid, None)
        if transfer is None:
            raise refusals.unknown_transfer(tid)
        device, host = self.device, self.host
        page, host_page, key = transfer.page, transfer.host_page, transfer.key
        if transfer.kind == PROMOTE:
            del self.incoming[page]
        if ok and transfer.kind == DEMOTE:
            host.content[host_page] = device.content[page]
            if key not in host.page_of:
                host.cache(host_page, key)
        elif ok:
            device.content[page] = host.content[host_page]
            if key not in device.page_of and page not in device.key_of:
                device.cache(page, key)
        device.release(page)
        host.release(host_page)

    # -- leases -------------------------------------------------------------------------------------

    def lease(self, page: object) -> int:
        p = require_int("page", page)
        device = self.device
        if not 0 <= p < len(device.refs):
            raise refusals.page_out_of_range(p, len(device.refs))
        if device.refs[p] == 0:
            raise refusals.retain_free_page(p)
        content = device.content[p]
        if content is None or p in self.incoming:
            raise refusals.not_written(p)
        lid = self._next_id()
        device.retain(p)
        self.leases[lid] = Lease(lid, p, content)
        return lid

    def end_lease(self, lease_id: object) -> Key | None:
        lid = require_int("lease id", lease_id)
        held = self.leases.pop(lid, None)
        if held is None:
            raise refusals.unknown_lease(lid)
        read = self.device.content[held.page]
        self.device.release(held.page)
        return read
