"""The automatic prefix cache in impl's engine, and the relief of pressure on the pool: the spec's
`kvsched.spec.engine_cache`, over impl's parts.

    publish_written   cache every full page a step completed, once its KV is written, in
                      admission order (the round's filled pages, one a slot, and the chunks')
    evict             evict cached pages held by the cache alone, in eviction order; with a host
                      tier, demote instead each page the host wants (`hold_demoted`: the copy's
                      hold on the page it reads)
    relieve           free pages for a later step: evict, else reclaim idle named prefixes
    drop_for_the_last with one request left to preempt, remove a published prefix that alone
                      holds a page it shares with the request

The part holds no state of its own: it changes the engine's cache, pool, store and host tier.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvsched.impl.engine_keys import PageKeys
from kvsched.impl.engine_rows import ADMITTED
from kvsched.impl.engine_running import Record, RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.impl.scheduler import RequestScheduler, get_slots
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.page_keys import Key
from kvsched.spec.prefix import droppable
from kvsched.spec.prefix_cache import get_cache_references


class CachePolicy:
    """The engine's cache policy; see the module docstring."""

    __slots__ = ("cache", "config", "host", "keys", "pool", "running", "scheduler", "store")

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        store: PrefixKvStore,
        scheduler: RequestScheduler,
        cache: PrefixCache,
        host: HostTier,
        keys: PageKeys,
        running: RunningSet,
    ) -> None:
        self.config, self.pool, self.store, self.scheduler = config, pool, store, scheduler
        self.cache, self.host, self.keys, self.running = cache, host, keys, running

    def publish_written(self, record: Record) -> None:
        """Cache the full pages each request completed this step, in admission order."""
        if not self.config.prefix_caching:
            return
        if not record.chunks:
            if record.filled:
                self._publish_round(record.filled)
            return
        page_size, fields = self.config.page_size, self.running.fields
        written = [(admitted, slot, depth, depth + 1) for admitted, slot, depth, _ in record.filled]
        for slot, start, stop in record.chunks:  # (admitted, slot, first page, end page)
            if start // page_size != stop // page_size:
                written.append((int(fields[slot, ADMITTED]), slot, start // page_size, stop // page_size))
        written.sort()
        keys: list[Key] = []
        rows: list[int] = []
        depths: list[int] = []
        parents: list[Key | None] = []
        for _, slot, first, end in written:
            slot_keys = self.keys.through(slot, self.running.request(slot), end)
            keys += slot_keys[first:end]
            parents += [slot_keys[first - 1] if first else None, *slot_keys[first : end - 1]]
            rows += [slot] * (end - first)
            depths += range(first, end)
        pages = get_slots(self.scheduler).tables[rows, depths].tolist()
        self.cache.insert(self.pool, keys, pages, depths, parents)

    def _publish_round(self, filled: list[list[int]]) -> None:
        """`publish_written` of a step without chunks: the page each request's round filled."""
        filled.sort()  # by admission
        keys = self.keys.of_filled(filled, self.running.request)
        slots = self.keys.slots
        parents = [slots[slot][depth - 1] if depth else None for _, slot, depth, _ in filled]
        self.cache.insert(self.pool, keys, [row[3] for row in filled], [row[2] for row in filled], parents)

    def evict(self, pages: int, keep: Sequence[int] = ()) -> int:
        """Evict `pages` cached pages (none of `keep`), or demote what the host tier wants: how
        many left the device's cache."""
        if pages <= 0 or not self.config.prefix_caching:
            return 0
        demoted = 0
        if self.host.pages:
            for page in self.cache.victims(self.pool, pages, keep).tolist():
                key, depth, parent = self.cache.entry(page)
                if self.host.wants(page, key):
                    self.hold_demoted(page)
                    self.host.demote(page, key, depth, parent)
                    demoted += 1
        evicted = self.cache.evict(self.pool, pages - demoted, keep)
        if evicted and self.host.refused:
            self.host.keep_refused(self.cache.cached_mask())
        return demoted + evicted

    def hold_demoted(self, page: int) -> None:
        """The demotion's copy holds its device page until it completes."""
        self.pool.retain(page)

    def relieve(self, pages: int, keep: Sequence[int] = ()) -> int:
        """Free pages for a later step: evict cached pages, else reclaim idle named prefixes."""
        evicted = self.evict(max(pages - self.pool.free_count(), 1), keep)
        if evicted:
            return evicted
        spare = self.cache.cached_mask().astype(np.uint32) if self.config.prefix_caching else None
        return self.store.reclaim(self.pool, pages, spare, keep)  # `keep`: reused, never counted freed

    def drop_for_the_last(self) -> bool:
        """With one request left to preempt, remove a published prefix that alone holds a page it
        shares with the request (a rare path: it reads the abstract states)."""
        if len(self.running.slots) != 1:
            return False
        cached = get_cache_references(self.cache.to_spec())
        identity = droppable(self.store.to_spec(), self.pool.to_spec(), cached)
        return identity is not None and self.store.remove(identity, self.pool)

    def __repr__(self) -> str:
        return f"CachePolicy(caching={self.config.prefix_caching}, host pages={self.host.pages})"
