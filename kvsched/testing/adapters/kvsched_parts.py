"""kvsched's own parts behind the adapter protocol: impl's pool, scheduler and automatic prefix
cache, driven as an engine drives them (the same calls `kvsched.impl.Engine` makes).

Admission hashes the prompt's full pages (SHA-256 chained keys), attaches the longest cached
run (leaving the last token to compute; in two phases, `lookup` then `commit`, the run a lookup
found as far as each page is still cached under the key it was found by), evicts cached pages
only the cache holds when the free stack is short, then makes the prompt's pages writable
(`record_chunk`). A decode makes its position's page writable (allocation or copy-on-write).
`written` publishes each full page once its KV is written. The cache's own reference is a holder
in kvsched's counts, not in the protocol's, so the view subtracts it; a page only the cache holds
is evictable, so it is free.

With a host tier (`host_pages`, the engine's `kvsched.impl.host_tier`): `demote` copies every
evictable cached page the host wants, in eviction order, to a host page; an admission's lookup
continues past the device run into the host tier, and each page found there is copied into the
request's fresh page (`promote` names the copies) and cached on the device. Copies complete as
they are made: the harness makes them. With leases as well, a lease is a connector's save: its
request's cached pages the host wants are copied to host pages that stay in flight (the view's
`host_pending`) until the lease ends, and `end_lease` names the copies. Its KV events are the
engine's publisher's (`kvsched.impl.engine_events`) over the same cache and host tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsched.impl.engine_events import CachePublisher
from kvsched.impl.host_tier import HostTier
from kvsched.impl.page_hash import PageHasher
from kvsched.impl.pool import BlockPool, get_arrays
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.impl.scheduler import RequestScheduler
from kvsched.spec.errors import CacheInUse, Exhausted
from kvsched.spec.host_tier import DEMOTE
from kvsched.spec.host_tier import Copy as HostCopy
from kvsched.spec.kv_events import KvEvent
from kvsched.spec.page_keys import CacheSalt, Key, pack_tokens, sha256
from kvsched.spec.pool import Copy
from kvsched.testing.adapter import PoolView

SALT = CacheSalt()


@dataclass(frozen=True, slots=True)
class Found:
    """A lookup's answer: the prompt's full pages' keys, and the pages cached under the first ones."""

    keys: tuple[Key, ...]
    pages: tuple[int, ...]


class KvschedManager:
    """impl's parts for `pages` pages of `page_size` tokens, up to `requests` live requests."""

    capabilities = frozenset({"fork", "copy_on_write", "reset_cache", "atomic", "events"})

    def __init__(
        self, pages: int, page_size: int, requests: int = 16, logical_pages: int = 64, host_pages: int = 0
    ) -> None:
        self.pool = BlockPool(pages)
        self.store = PrefixKvStore(1, logical_pages, pool=self.pool)
        self.scheduler = RequestScheduler(
            requests, logical_pages, pool=self.pool, prefixes=self.store, page_size=page_size
        )
        self.cache = PrefixCache(pages)
        self.hasher = PageHasher(page_size, sha256)
        self.page_size, self.width = page_size, logical_pages * page_size
        self.tokens: dict[int, list[int]] = {}
        self.keys: dict[int, list[Key]] = {}  # each request's full pages' keys, as far as known
        self.published: dict[int, int] = {}  # each request's pages cached so far
        self._copies: list[tuple[int, int]] = []  # the last append's copy-on-write
        self.leases: dict[int, list[int]] = {}  # a reader's lease -> the pages it holds
        self.saves: dict[int, list[HostCopy]] = {}  # a reader's lease -> the copies to the host tier it makes
        self._next_lease = 0
        self.host = HostTier(host_pages)
        self._promoted: dict[int, list[tuple[int, int]]] = {}  # the last admission's (host page, page) copies
        self.publisher = CachePublisher("kvsched", 0, page_size, self.cache, self.host)

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        return self.commit(request_id, tokens, self.lookup(request_id, tokens))

    def lookup(self, request_id: int, tokens: Sequence[int]) -> Found:
        """The prompt's full pages' keys and the run of them the cache holds now (no change)."""
        keys = self.hasher.keys_of(pack_tokens(tokens), len(tokens) // self.page_size, SALT)
        return Found(tuple(keys), tuple(self.cache.lookup(keys[: (len(tokens) - 1) // self.page_size])))

    def commit(self, request_id: int, tokens: Sequence[int], found: Found) -> int | None:
        """Admit with what a lookup found, as far as the cache still holds it: each page must
        still be cached under the key it was found by (one evicted, or reused, since ends the run)."""
        self.cache.settle()
        size = self.page_size
        if self.scheduler.active_count() == self.scheduler.requests or len(tokens) > self.width:
            return None
        keys = list(found.keys)
        hit = self.revalidated(found)
        if not self._room(-(-len(tokens) // size) - len(hit), keep=hit):
            return None
        self.scheduler.admit_with_prefix(request_id, None, self.store, self.pool)
        if hit:
            self.scheduler.attach_pages(request_id, hit, self.pool)
        self.scheduler.record_chunk(request_id, len(tokens) - len(hit) * size, self.pool)
        self.tokens[request_id], self.keys[request_id] = list(tokens), keys
        self.published[request_id] = len(hit)
        fetched = self._promote(request_id, keys[len(hit) : (len(tokens) - 1) // size], len(hit))
        return (len(hit) + fetched) * size

    def _promote(self, request_id: int, keys: list[Key], first: int) -> int:
        """Copy the run of `keys` the host tier holds into the request's pages from logical page
        `first`, and cache them; how many."""
        fetch = self.host.run(keys) if self.host.pages else []
        table = self.scheduler.page_table(request_id)
        pairs, pages = [], []
        for depth, (key, host_page, _) in enumerate(fetch, start=first):
            page = table[depth]
            assert page is not None
            transfer_id = self.host.promote(key, page, request_id)
            self.host.complete(self.host.copies[transfer_id], True)
            pairs.append(self._promoted_pair(host_page, page))
            pages.append(page)
        if pages:
            chain = self.keys[request_id]
            parents = [chain[depth - 1] if depth else None for depth in range(first, first + len(pages))]
            self.cache.insert(self.pool, [key for key, _, _ in fetch], pages, range(first, first + len(pages)), parents)
            self.published[request_id] = first + len(pages)
        self._promoted[request_id] = pairs
        return len(pages)

    def _promoted_pair(self, host_page: int, page: int) -> tuple[int, int]:
        return host_page, page

    def promote(self, request_id: int) -> list[tuple[int, int]]:
        return self._promoted.get(request_id, [])

    def demote(self) -> list[tuple[int, int]]:
        """Copy each evictable cached page the host tier wants, in eviction order, to it."""
        self.cache.settle()
        pairs = []
        for page in self.cache.victims(self.pool, self.cache.cached_mask().shape[0]).tolist():
            key, depth, parent = self.cache.entry(page)
            if self.host.wants(page, key):
                copy = self.host.demote(page, key, depth, parent)
                self._complete_demotion(copy)
                pairs.append((page, copy.host_page))
        return pairs

    def _complete_demotion(self, copy: HostCopy) -> None:
        self.host.complete(copy, True)

    def append(self, request_id: int, token: int) -> bool:
        self.cache.settle()
        tokens = self.tokens[request_id]
        if len(tokens) == self.width:
            return False
        try:
            action = self.scheduler.ensure_writable(request_id, len(tokens) // self.page_size, self.pool)
        except Exhausted:
            if not self._room(1, keep=()):
                return False
            action = self.scheduler.ensure_writable(request_id, len(tokens) // self.page_size, self.pool)
        self._copies = [(action.source, action.destination)] if isinstance(action, Copy) else []
        self.scheduler.record_tokens(request_id, 1)
        tokens.append(token)
        return True

    def copies(self) -> list[tuple[int, int]]:
        return self._copies

    def written(self, request_id: int, tokens: int) -> None:
        first, end = self.published[request_id], tokens // self.page_size
        if end <= first:
            return
        keys = self.keys[request_id]
        if len(keys) < end:
            self.hasher.extend(keys, pack_tokens(self.tokens[request_id][: end * self.page_size]), end, SALT)
        table = self.scheduler.page_table(request_id)
        parents = [keys[first - 1] if first else None, *keys[first : end - 1]]
        pages = [page for page in table[first:end] if page is not None]
        self.cache.insert(self.pool, keys[first:end], pages, range(first, end), parents)
        self.published[request_id] = end

    def free(self, request_id: int) -> None:
        self.cache.settle()
        row = np.asarray([page for page in self.scheduler.page_table(request_id) if page is not None], dtype=np.uint32)
        self.cache.stamp(row[None, :])
        self.scheduler.finish(request_id, self.pool)
        del self.tokens[request_id], self.keys[request_id], self.published[request_id]
        self._promoted.pop(request_id, None)

    # --8<-- [start:optional-verbs]
    def fork(self, parent_id: int, child_id: int) -> bool:
        if self.scheduler.active_count() == self.scheduler.requests:
            return False
        self.scheduler.fork(parent_id, child_id, self.pool)
        self.tokens[child_id] = list(self.tokens[parent_id])
        self.keys[child_id] = list(self.keys[parent_id])
        self.published[child_id] = self.published[parent_id]
        return True

    def reset_cache(self) -> bool:
        self.cache.settle()
        try:
            self.cache.reset(self.pool)
        except CacheInUse:
            return False
        self.publisher.reset()
        return True

    # --8<-- [end:optional-verbs]

    def lease(self, request_id: int) -> int:
        """A reader holds the request's pages: one more reference on each. With a host tier it
        is a connector's save: each cached page whose key the tier wants is copied to it, the
        copy in flight until the lease ends."""
        pages = [page for page in self.scheduler.page_table(request_id) if page is not None]
        for page in pages:
            self.pool.retain(page)
        self._next_lease += 1
        self.leases[self._next_lease] = pages
        self.cache.settle()
        cached, saving = self.cache.cached_mask(), []
        for page in pages:
            if not cached[page]:
                continue
            key, depth, parent = self.cache.entry(page)
            if self.host.wants(page, key):
                saving.append(self.host.demote(page, key, depth, parent))
        self.saves[self._next_lease] = saving
        return self._next_lease

    def end_lease(self, lease: int) -> list[tuple[int, int]]:
        """The save's copies complete; the reader lets go of the pages. The copies made."""
        saving = self.saves.pop(lease)
        for copy in saving:
            self._complete_demotion(copy)
        for page in self.leases.pop(lease):
            self.pool.release(page)
        return [(copy.page, copy.host_page) for copy in saving]

    def events(self) -> list[KvEvent]:
        """The KV events since the last call: the engine's publisher over the cache and host tier."""
        batch = self.publisher.take_cached()
        return [] if batch is None else list(batch.events)

    def revalidated(self, found: Found) -> list[int]:
        """The leading pages of `found` still cached under the keys they were found by."""
        now = self.cache.lookup(found.keys[: len(found.pages)])
        run = 0
        while run < len(now) and now[run] == found.pages[run]:
            run += 1
        return list(found.pages[:run])

    def view(self) -> PoolView:
        refs = get_arrays(self.pool).refs.astype(np.int64)
        cached = self.cache.cached_mask()
        leased = np.zeros_like(refs)
        for pages in self.leases.values():
            np.add.at(leased, pages, 1)
        holders = refs - cached - leased
        spec, host = self.cache.to_spec(), self.host.to_spec()
        tables = {request_id: self.scheduler.page_table(request_id) for request_id in self.tokens}
        return PoolView(
            holders=tuple(holders.tolist()),
            free=frozenset(np.flatnonzero(holders + leased == 0).tolist()),
            tables={
                request_id: tuple(page for page in table if page is not None) for request_id, table in tables.items()
            },
            cached={entry.page: entry.key for entry in spec.pages},
            leased={page: int(n) for page, n in enumerate(leased.tolist()) if n},
            host={entry.page: entry.key for entry in host.cache},
            host_free=frozenset(host.free),
            host_pages=host.pages,
            host_pending=frozenset(copy.host_page for copy in host.copies if copy.kind == DEMOTE),
        )

    def _room(self, pages: int, keep: Sequence[int]) -> bool:
        """Free pages enough for `pages` new ones, evicting cached pages not in `keep` if that
        suffices; False (nothing evicted) if it does not."""
        short = pages - self.pool.free_count()
        if short <= 0:
            return True
        refs = get_arrays(self.pool).refs
        evictable = np.flatnonzero(self.cache.cached_mask() & (refs == 1))
        if np.setdiff1d(evictable, np.asarray(keep, dtype=np.int64)).shape[0] < short:
            return False
        self.cache.evict(self.pool, short, keep)
        return True


def manager(pages: int, page_size: int) -> KvschedManager:
    """kvsched's parts, with the automatic prefix cache."""
    return KvschedManager(pages, page_size)


def every_verb(pages: int, page_size: int) -> KvschedManager:
    """kvsched's parts with every optional verb declared: two-phase admission (`lookup`, other
    calls, `commit`), leases (`lease`, other calls, `end_lease`) and a host tier (`demote`,
    `promote`) as well."""
    manager = KvschedManager(pages, page_size, host_pages=pages)
    manager.capabilities = KvschedManager.capabilities | {"lookup", "commit", "lease", "end_lease", "demote", "promote"}
    return manager


def tiered(pages: int, page_size: int) -> KvschedManager:
    """kvsched's parts with a host tier of as many pages as the device's (`demote`, `promote`)."""
    manager = KvschedManager(pages, page_size, host_pages=pages)
    manager.capabilities = KvschedManager.capabilities | {"demote", "promote"}
    return manager
