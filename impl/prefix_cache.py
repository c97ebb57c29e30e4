"""The automatic prefix cache over impl's pool: the spec's `prefix_cache`, built for speed.

Storage, allocated at construction, one entry per physical page:

    index      dict key -> page
    keys       list, the key cached on each page (None: not cached)
    parents    list, the key before it in its chain (None at depth 0)
    cached     bool[pages]
    depth      int64[pages]      chain depth (logical page index)
    last_used  int64[pages]      the clock's stamp of its last use

Eviction sorts the evictable pages (cached, reference count 1) by the spec's order with one
`np.lexsort`. Rollback is a journal: every change appends what undoes it, `mark()` names a
point and `undo(mark)` returns to it exactly (the engine marks at the start of each step);
`settle()` forgets the journal once nothing can roll back; while someone watches the cache
(`watched`, a set: the KV events' publisher), it first adds the keys the journal cached or
evicted to it. `to_spec()` is the abstraction function to the spec's `CacheState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from kvsched.impl.pool import BlockPool, get_arrays, release_array, retain_array
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.page_keys import Key
from kvsched.spec.prefix_cache import CachedPage, CacheState, CacheStats

QUERIES, QUERY_TOKENS, HITS, HIT_TOKENS, EVICTIONS = range(5)
Mark = tuple[int, int, tuple[int, ...]]
NOTHING_COUNTED = CacheStats()  # frozen: one instance serves every step that counts nothing


class PrefixCache:
    """Cached pages of one pool, found by key; see the module docstring."""

    def __init__(self, pages: int) -> None:
        self._index: dict[Key, int] = {}
        self._keys: list[Key | None] = [None] * pages
        self._parents: list[Key | None] = [None] * pages
        self._cached = np.zeros(pages, dtype=np.bool_)
        self._depth = np.zeros(pages, dtype=np.int64)
        self._last_used = np.zeros(pages, dtype=np.int64)
        self.clock = 0
        self._stats = [0, 0, 0, 0, 0]
        self._journal: list[tuple[Any, ...]] = []
        self.watched: set[Key] | None = None  # the keys cached or evicted since the watcher last looked

    # -- the abstraction ----------------------------------------------------------------------

    def to_spec(self) -> CacheState:
        """The abstraction function: this cache as the spec's `CacheState`."""
        pages = np.flatnonzero(self._cached).tolist()
        depth, last_used = self._depth[pages].tolist(), self._last_used[pages].tolist()
        entries = []
        for page, page_depth, stamp in zip(pages, depth, last_used, strict=True):
            key = self._keys[page]
            assert key is not None
            entries.append(CachedPage(page, key, page_depth, stamp, self._parents[page]))
        return CacheState(tuple(entries), self.clock, CacheStats(*self._stats))

    @property
    def stats(self) -> CacheStats:
        """The counters."""
        return CacheStats(*self._stats)

    def counters(self) -> tuple[int, ...]:
        """The counters as they are now, for `since`."""
        return tuple(self._stats)

    def since(self, counters: tuple[int, ...]) -> CacheStats:
        """What the counters counted after `counters` were read."""
        if tuple(self._stats) == counters:
            return NOTHING_COUNTED  # most steps: no query, no eviction
        return CacheStats(*[now - then for now, then in zip(self._stats, counters, strict=True)])

    def cached_mask(self) -> npt.NDArray[np.bool_]:
        """Which pages are cached (the cache's one reference on each)."""
        return self._cached

    # -- rollback -----------------------------------------------------------------------------

    def mark(self) -> Mark:
        """A point `undo` can return to."""
        return (len(self._journal), self.clock, tuple(self._stats))

    def undo(self, mark: Mark) -> None:
        """Undo every change since `mark` (the pool's references are the pool's to put back)."""
        length, clock, stats = mark
        journal = self._journal
        while len(journal) > length:
            entry = journal.pop()
            if entry[0] == "insert":
                for page in reversed(entry[1]):
                    self._drop(page)
            elif entry[0] == "evict":
                _, page, key, depth, stamp, parent = entry
                self._add(page, key, depth, stamp, parent)
            else:
                _, pages, stamps = entry
                self._last_used[pages] = stamps
        self.clock, self._stats = clock, list(stats)

    def settle(self) -> None:
        """Forget the journal (no mark taken so far will be undone), its keys added to `watched`."""
        if self.watched is not None:
            self.watched |= self.changed()
        self._journal.clear()

    def changed(self) -> set[Key]:
        """The keys the journal cached or evicted (an evicted page's key is in its entry; a page
        cached since keeps its latest key)."""
        keys: set[Key] = set()
        for entry in self._journal:
            if entry[0] == "insert":
                keys.update(key for key in map(self._keys.__getitem__, entry[1]) if key is not None)
            elif entry[0] == "evict":
                keys.add(entry[2])
        return keys

    def cached_keys(self) -> list[Key]:
        """Every cached key."""
        return list(self._index)

    def cached(self, key: Key) -> tuple[Key | None, int] | None:
        """The parent and depth of the page cached under `key` (None: it is not cached)."""
        page = self._index.get(key)
        return None if page is None else (self._parents[page], int(self._depth[page]))

    # -- operations ---------------------------------------------------------------------------

    def lookup(self, keys: Sequence[Key]) -> list[int]:
        """The pages cached under `keys[0]`, `keys[1]`, ... up to the first key not cached."""
        pages: list[int | None] = list(map(self._index.get, keys))
        if None in pages:
            del pages[pages.index(None) :]
        return cast(list[int], pages)  # no None is left

    def insert(
        self,
        pool: BlockPool,
        keys: Sequence[Key],
        pages: Sequence[int],
        depths: Sequence[int],
        parents: Sequence[Key | None],
    ) -> None:
        """Cache `pages[i]` under `keys[i]` at depth `depths[i]` after `parents[i]`, in order (the
        spec's `insert` each: a key or a page already cached is left as it is), retaining the
        ones taken."""
        index, cached_keys, cached_parents = self._index, self._keys, self._parents
        taken: list[int] = []
        taken_depths: list[int] = []
        for key, page, depth, parent in zip(keys, pages, depths, parents, strict=True):
            if key in index or cached_keys[page] is not None:
                continue
            index[key] = page
            cached_keys[page] = key
            cached_parents[page] = parent
            taken.append(page)
            taken_depths.append(depth)
        if taken:
            self._journal.append(("insert", taken))
            added = np.asarray(taken, dtype=np.int64)
            self._cached[added] = True
            self._depth[added] = taken_depths
            self._last_used[added] = self.clock
            self._hold(pool, added)

    def stamp(self, rows: npt.NDArray[np.uint32]) -> None:
        """Requests released their pages, one request a row of `rows` (page ids, INVALID_BLOCK
        where unmapped) in order: the spec's `stamp` of each, the clock ticking after each."""
        stamps = np.broadcast_to(np.arange(self.clock, self.clock + rows.shape[0])[:, None], rows.shape)
        mapped = rows != INVALID_BLOCK
        pages, stamps = rows[mapped].astype(np.intp), stamps[mapped]
        used = self._cached[pages]
        pages, stamps = pages[used], stamps[used]
        if pages.shape[0]:
            self._journal.append(("stamp", pages, self._last_used[pages].copy()))
            np.maximum.at(self._last_used, pages, stamps)  # a later release's stamp wins: it is larger
        self.clock += rows.shape[0]

    def victims(self, pool: BlockPool, count: int, keep: Sequence[int] = ()) -> npt.NDArray[np.intp]:
        """The first `count` evictable pages in the spec's eviction order, none in `keep`."""
        refs = get_arrays(pool).refs
        candidates = np.flatnonzero(self._cached & (refs == 1))
        if len(keep):
            candidates = candidates[~np.isin(candidates, np.asarray(keep, dtype=np.int64))]
        order = np.lexsort((candidates, -self._depth[candidates], self._last_used[candidates]))
        return candidates[order[: max(count, 0)]]

    def entry(self, page: int) -> tuple[Key, int, Key | None]:
        """The cached `page`'s key, depth and parent."""
        key = self._keys[page]
        assert key is not None, "a cached page"
        return key, int(self._depth[page]), self._parents[page]

    def evict(self, pool: BlockPool, count: int, keep: Sequence[int] = ()) -> int:
        """Evict up to `count` evictable pages in the spec's order, none in `keep`; how many."""
        if count <= 0:
            return 0
        victims = self.victims(pool, count, keep)
        if victims.shape[0] == 0:
            return 0
        self._evicted(pool, victims)
        self._stats[EVICTIONS] += victims.shape[0]
        return int(victims.shape[0])

    def reset(self, pool: BlockPool) -> None:
        """Drop every cached page; `CacheInUse` (nothing changed) while any is held elsewhere."""
        refs = get_arrays(pool).refs
        pages = np.flatnonzero(self._cached)
        held = pages[refs[pages] != 1]
        if held.shape[0]:
            raise refusals.cache_in_use(held.tolist())
        self._leave(pool, pages)

    def count_query(self, tokens: int, hit_tokens: int) -> None:
        """An admission looked up `tokens` tokens and found `hit_tokens` of them."""
        stats = self._stats
        stats[QUERIES] += 1
        stats[QUERY_TOKENS] += tokens
        stats[HITS] += hit_tokens > 0
        stats[HIT_TOKENS] += hit_tokens

    # -- storage ------------------------------------------------------------------------------

    def _hold(self, pool: BlockPool, pages: Any) -> None:
        """The cache's own reference on each page it caches."""
        retain_array(pool, pages)

    def _evicted(self, pool: BlockPool, pages: npt.NDArray[np.intp]) -> None:
        """Evicted `pages` leave the cache: keys dropped, references released."""
        self._leave(pool, pages)

    def _leave(self, pool: BlockPool, pages: npt.NDArray[np.intp]) -> None:
        """`pages` (each cached, held only by the cache) leave it, released in order; journaled."""
        release_array(pool, pages)
        for page in pages.tolist():
            key = self._keys[page]
            entry = ("evict", page, key, int(self._depth[page]), int(self._last_used[page]), self._parents[page])
            self._journal.append(entry)
            self._drop(page)

    def _add(self, page: int, key: Key, depth: int, stamp: int, parent: Key | None) -> None:
        self._index[key] = page
        self._keys[page] = key
        self._parents[page] = parent
        self._cached[page] = True
        self._depth[page] = depth
        self._last_used[page] = stamp

    def _drop(self, page: int) -> None:
        key = self._keys[page]
        assert key is not None
        del self._index[key]
        self._keys[page] = None
        self._parents[page] = None
        self._cached[page] = False
        self._depth[page] = 0
        self._last_used[page] = 0

    def __repr__(self) -> str:
        return f"PrefixCache(pages={len(self._keys)}, cached={len(self._index)})"
