"""The automatic prefix cache: full pages found again by their content's key (`page_keys`).

Modelled: a set of cached pages, each under one key (the key of the chain of tokens it holds),
at a chain depth (its logical page index), with the cache clock's stamp of its last use. The
cache is a plain owner: it holds exactly one pool reference on each cached page, beside request
tables and the named prefix store, and the invariants count it.

    insert   a page whose KV is written (the engine publishes only after the step that
             completed the page succeeded) enters under its key, retained; a key or page
             already cached is left as it is (the first page holding a content stays)
    lookup   the longest run of keys cached from a start, in order (no change)
    stamp    a request released these pages: cached ones are stamped now (the clock ticks)
    evict    evictable pages (held by the cache alone) leave, least recently used first, ties
             to the deeper page first, then the lower page id; each is released
    reset    every cached page leaves; refused (`CacheInUse`) while any is held by anyone else

Every transition is a pure function of the state and returns the new state or raises with
nothing changed. `CacheStats` counts queries (admissions that looked up), their tokens, hits,
hit tokens and evicted pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvsched.spec import pool as pool_ops
from kvsched.spec import refusals
from kvsched.spec.page_keys import Key
from kvsched.spec.pool import PoolState


@dataclass(frozen=True, slots=True)
class CachedPage:
    """One cached page: its key, its chain depth (logical page index), last-use stamp, and the
    key of the page before it in its chain (None at depth 0)."""

    page: int
    key: Key
    depth: int
    last_used: int
    parent: Key | None = None


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Lookup and eviction counters."""

    queries: int = 0  # admissions that looked the cache up
    query_tokens: int = 0  # their sequences' tokens
    hits: int = 0  # lookups that found at least one page
    hit_tokens: int = 0  # tokens whose KV came from the cache
    evictions: int = 0  # pages evicted

    def __sub__(self, other: CacheStats) -> CacheStats:
        return CacheStats(
            self.queries - other.queries,
            self.query_tokens - other.query_tokens,
            self.hits - other.hits,
            self.hit_tokens - other.hit_tokens,
            self.evictions - other.evictions,
        )


@dataclass(frozen=True, slots=True)
class CacheState:
    """The cached pages in page order, the clock, the counters."""

    pages: tuple[CachedPage, ...] = ()
    clock: int = 0
    stats: CacheStats = field(default_factory=CacheStats)


EMPTY_CACHE = CacheState()


def find(state: CacheState, key: Key) -> int | None:
    """The page cached under `key`, if any."""
    return next((entry.page for entry in state.pages if entry.key == key), None)


def is_cached(state: CacheState, page: int) -> bool:
    """`page` is in the cache."""
    return any(entry.page == page for entry in state.pages)


def lookup(state: CacheState, keys: Sequence[Key]) -> tuple[int, ...]:
    """The pages cached under `keys[0]`, `keys[1]`, ... up to the first key not cached."""
    pages = []
    for key in keys:
        page = find(state, key)
        if page is None:
            break
        pages.append(page)
    return tuple(pages)


def insert(
    state: CacheState, pool: PoolState, key: Key, page: int, depth: int, parent: Key | None = None
) -> tuple[CacheState, PoolState]:
    """Cache the written, held `page` under `key`, after `parent` in its chain (retained once);
    a cached key or page stays."""
    if find(state, key) is not None or is_cached(state, page):
        return state, pool
    pool = pool_ops.retain(pool, page)
    entry = CachedPage(page, key, depth, state.clock, parent)
    pages = tuple(sorted((*state.pages, entry), key=lambda cached: cached.page))
    return replace(state, pages=pages), pool


def stamp(state: CacheState, pages: Sequence[int]) -> CacheState:
    """A request released `pages`: the cached ones were used now; the clock ticks."""
    released = set(pages)
    stamped = tuple(replace(entry, last_used=state.clock) if entry.page in released else entry for entry in state.pages)
    return replace(state, pages=stamped, clock=state.clock + 1)


def is_evictable(pool: PoolState, entry: CachedPage) -> bool:
    """Only the cache holds the page: evicting it frees it."""
    return pool.refs[entry.page] == 1


def eviction_order(entry: CachedPage) -> tuple[int, int, int]:
    """The smallest is evicted first: least recently used, then deepest, then lowest page."""
    return (entry.last_used, -entry.depth, entry.page)


def evictable(state: CacheState, pool: PoolState) -> list[CachedPage]:
    """The evictable pages, in eviction order."""
    return sorted((entry for entry in state.pages if is_evictable(pool, entry)), key=eviction_order)


def evict(
    state: CacheState, pool: PoolState, pages: int, keep: Sequence[int] = ()
) -> tuple[CacheState, PoolState, int]:
    """Evict up to `pages` evictable pages in eviction order, never one in `keep` (pages an
    admission is about to reuse); how many were evicted."""
    kept_pages = set(keep)
    victims = [entry for entry in evictable(state, pool) if entry.page not in kept_pages][: max(pages, 0)]
    for entry in victims:
        pool = pool_ops.release(pool, entry.page)
    gone = {entry.page for entry in victims}
    stats = replace(state.stats, evictions=state.stats.evictions + len(victims))
    kept = tuple(entry for entry in state.pages if entry.page not in gone)
    return replace(state, pages=kept, stats=stats), pool, len(victims)


def reset(state: CacheState, pool: PoolState) -> tuple[CacheState, PoolState]:
    """Drop every cached page; `CacheInUse` (nothing changed) while any is held elsewhere."""
    held = [entry.page for entry in state.pages if not is_evictable(pool, entry)]
    if held:
        raise refusals.cache_in_use(held)
    for entry in state.pages:
        pool = pool_ops.release(pool, entry.page)
    return replace(state, pages=()), pool


def count_query(state: CacheState, tokens: int, hit_tokens: int) -> CacheState:
    """An admission looked up a sequence of `tokens` tokens and found `hit_tokens` of them."""
    stats = state.stats
    stats = CacheStats(
        stats.queries + 1,
        stats.query_tokens + tokens,
        stats.hits + (hit_tokens > 0),
        stats.hit_tokens + hit_tokens,
        stats.evictions,
    )
    return replace(state, stats=stats)


def get_cache_references(state: CacheState) -> dict[int, int]:
    """The references the cache holds: one on each cached page."""
    return dict.fromkeys((entry.page for entry in state.pages), 1)
