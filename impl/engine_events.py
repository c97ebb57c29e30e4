"""The engine's KV events over impl's cache: the spec's `kvsched.spec.engine_events` publisher,
reading what changed rather than the whole cache.

The publisher watches the device cache (`PrefixCache.watched`: the keys its journal cached or
evicted, collected each time the journal is settled), so a batch compares only those keys with
what it published; the host tier's cache is compared whole (it is the smaller). Its first batch,
and the first after a reset, read the whole cache. Same batches, in the same order, as the spec's.
"""

from __future__ import annotations

from kvsched.impl.host_tier import HostTier
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.spec.engine_events import Publisher
from kvsched.spec.kv_events import DEVICE, HOST, Entry, EventBatch, Key


class CachePublisher(Publisher):
    """The spec's publisher over impl's device cache and host tier."""

    def __init__(self, engine: object, epoch: object, tokens: int, cache: PrefixCache, host: HostTier) -> None:
        super().__init__(engine, epoch, tokens)
        self.cache, self.host = cache, host
        self.hosted: list[Entry] = []  # the host tier's entries published (the device's are never walked)

    def take_cached(self) -> EventBatch | None:
        """The batch since the last one (the spec's `take` of the engine's cached set)."""
        cache = self.cache
        now: dict[Entry, tuple[Key | None, int]] = {
            (key, HOST): (parent, depth) for key, (_, depth, parent) in self.host.cached().items()
        }
        before = list(self.hosted)
        watched = cache.watched
        whole = watched is None or self.cleared  # the first batch, or the first after a reset
        keys = cache.cached_keys() if watched is None or whole else watched | cache.changed()
        for key in keys:
            entry = cache.cached(key)
            if entry is not None:
                now[key, DEVICE] = entry
        if whole:
            before = list(self.published)
        else:
            before += [(key, DEVICE) for key in keys if (key, DEVICE) in self.published]
        batch = self.publish(before, now)
        cache.watched = set()
        self.hosted = [entry for entry in now if entry[1] == HOST]
        return batch
