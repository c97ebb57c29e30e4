"""The automatic prefix cache in the engine, and the relief of pressure on the pool.

    publish_written   cache every page a step completed, once its KV is written
    evict             evict cached pages held by the cache alone, in eviction order; with a
                      host tier, demote instead each page the host wants
    relieve           free pages for a later step: evict, else reclaim idle named prefixes
    drop_for_the_last with one request left to preempt, remove a published prefix that alone
                      holds a page it shares others with the request

The cache's state is `work.cache` (`kvsched.spec.prefix_cache`); a page it holds is one
reference in the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsched.spec import host_tier
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.engine_config import salt_of
from kvsched.spec.engine_running import StepRecord
from kvsched.spec.engine_state import sequence_of
from kvsched.spec.engine_work import Work
from kvsched.spec.page_keys import page_keys
from kvsched.spec.prefix import droppable


def publish_written(work: Work, record: StepRecord) -> None:
    """Cache every page this step completed, now that its KV is written: each request's full
    pages that end inside the positions this step wrote (finishing requests included)."""
    if not work.config.prefix_caching:
        return
    page_size = work.config.page_size
    for entry in work.running:
        request_id = entry.request.request_id
        start, stop = record.written.get(request_id, (0, 0))
        first, end = start // page_size, stop // page_size
        if first == end:
            continue
        sequence = sequence_of(entry.request, entry.generated)
        keys = page_keys(sequence, page_size, salt_of(work.config, entry.request), work.digest, end)
        table = work.scheduler.page_table(request_id)
        for depth in range(first, end):
            page = table[depth]
            assert page is not None
            parent = keys[depth - 1] if depth else None
            work.cache, pool = cache_ops.insert(work.cache, work.pool.state, keys[depth], page, depth, parent)
            work.pool.commit(pool)


def evict(work: Work, pages: int, keep: Sequence[int] = ()) -> int:
    """Evict up to `pages` cached pages held by the cache alone (not those in `keep`), in
    eviction order; with a host tier, each the host wants is demoted instead (its copy holds
    it, still cached, until it completes; a page whose demotion failed is refused, so it is
    evicted). How many were evicted or demoted."""
    if pages <= 0 or not work.config.prefix_caching:
        return 0
    demoted = 0
    if work.host.pages:
        kept = set(keep)
        victims = [entry for entry in cache_ops.evictable(work.cache, work.pool.state) if entry.page not in kept]
        for entry in victims[:pages]:
            if host_tier.wants(work.host, entry.page, entry.key):
                work.pool.retain(entry.page)  # the copy's hold
                work.host = host_tier.demote(work.host, entry.page, entry.key, entry.depth, entry.parent)
                demoted += 1
    work.cache, pool, evicted = cache_ops.evict(work.cache, work.pool.state, pages - demoted, tuple(keep))
    work.pool.commit(pool)
    if evicted and work.host.refused:
        work.host = host_tier.keep_refused(work.host, {entry.page for entry in work.cache.pages})
    return demoted + evicted


def relieve(work: Work, pages: int, keep: Sequence[int] = ()) -> int:
    """Free pages toward `pages` free for a later step: evict cached pages, else reclaim idle
    named prefixes (counting the cache's references, but for those in `keep`, as idle); how
    many it freed or left evictable."""
    evicted = evict(work, max(pages - work.pool.free_count(), 1), keep)
    if evicted:
        return evicted
    spare = cache_ops.get_cache_references(work.cache)
    return work.store.reclaim(work.pool, pages, spare, tuple(keep))  # `keep`: reused, so never counted freed


def drop_for_the_last(work: Work) -> bool:
    """With one request left to preempt, remove a published prefix that alone holds a page it
    shares others with the request (`droppable`), if there is one. Preempting the last request
    would not help it: readmitted alone, it would meet the same pages held, forever."""
    if len(work.running) != 1:
        return False
    cached = cache_ops.get_cache_references(work.cache)
    identity = droppable(work.store.state, work.pool.state, cached)
    return identity is not None and work.store.remove(identity, work.pool)
