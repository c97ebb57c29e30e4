"""Named shared prefixes: the fixed-capacity prefix store as struct-of-arrays.

Refines `kvsched.spec.prefix.StoreState`. Entry `e` is occupied iff `identities[e]` is not None;
its page set is `pages[e, :page_counts[e]]` and `token_counts[e]`, its LRU stamp `last_used[e]`.
`to_spec()` is the abstraction function

    StoreState(entries = (StoreEntry(PrefixPageSet(identities[e], pages[e, :page_counts[e]],
                                                  token_counts[e]), last_used[e])
                         or None for each e),
               page_capacity, next_victim, clock)

Representation invariants: `index` maps exactly the occupied identities to their entries;
`empty` is a min-heap of exactly the unoccupied entries (so "the first empty entry" is its top).
The `[entries, pages]` page array is allocated at construction, as the original's const-generic
arrays are.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.impl.jit import jit
from kvsched.impl.pool import BlockPool, get_arrays, release_array, retain_sequence
from kvsched.impl.table import SequenceBlockTable, TableRow, get_row, install_row_prefix
from kvsched.spec import refusals
from kvsched.spec.binding import Binding
from kvsched.spec.domain import require_int
from kvsched.spec.errors import KvschedError
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.prefix import PrefixPageSet, StoreEntry, StoreState, initial_store, require_reclaim_target


class PrefixKvStore:
    """Fixed-capacity prefix store with explicit physical-page ownership.

    Complexity: `get`, `attach` and `remove` are O(1) dictionary lookups plus O(pages of the set);
    `publish` adds O(log entries) for the lowest empty entry; `reclaim` is O(entries x pages +
    pool pages) per evicted entry (a pressure path, not a hot one).
    Ordering promises (the spec's): `publish` retains the new pages before the set is visible and
    releases a replaced set after; a full store replaces round-robin; `reclaim` evicts idle entries
    least recently used first, ties to the lowest entry. Every operation is atomic.
    """

    __slots__ = (
        "_clock",
        "_empty",
        "_identities",
        "_index",
        "_last_used",
        "_next_victim",
        "_page_capacity",
        "_page_counts",
        "_pages",
        "_pool",
        "_token_counts",
    )

    def __init__(self, entries: int, pages: int, *, pool: BlockPool | None = None) -> None:
        initial_store(entries, pages)  # the spec's checks, order and messages
        entries, pages = require_int("entries", entries), require_int("pages", pages)  # numpy ints as ints
        self._pool = Binding(BlockPool, "prefix store")
        if pool is not None:
            self._pool.bind(self._pool.check("pool", pool))
        self._identities: list[PrefixIdentity | None] = [None] * entries
        self._index: dict[PrefixIdentity, int] = {}
        self._empty: list[int] = list(range(entries))  # ascending: already a heap
        self._pages = np.zeros((entries, pages), dtype=np.uint32)
        self._page_counts = np.zeros(entries, dtype=np.int64)
        self._token_counts = np.zeros(entries, dtype=np.uint32)
        self._last_used = np.zeros(entries, dtype=np.int64)
        self._page_capacity = pages
        self._next_victim = 0
        self._clock = 0

    @property
    def entries(self) -> int:
        """The number of entries."""
        return len(self._identities)

    @property
    def page_capacity(self) -> int:
        """The most pages one entry holds."""
        return self._page_capacity

    @property
    def state(self) -> StoreState:
        """The abstract state (`to_spec()`)."""
        return self.to_spec()

    def to_spec(self) -> StoreState:
        """The abstraction function: this store as the spec's `StoreState`."""
        slots = tuple(
            None if self._identities[entry] is None else StoreEntry(self._page_set(entry), int(self._last_used[entry]))
            for entry in range(self.entries)
        )
        return StoreState(slots, self._page_capacity, self._next_victim, self._clock)

    def _page_set(self, entry: int) -> PrefixPageSet:
        identity = self._identities[entry]
        assert identity is not None
        pages = self._pages[entry, : self._page_counts[entry]].tolist()
        return PrefixPageSet(identity, tuple(pages), int(self._token_counts[entry]))

    def check_pool(self, pool: object) -> BlockPool:
        """`pool`, if it is a `BlockPool` this store may work with; else `InvalidArgument`
        (`kvsched.spec.binding`)."""
        bound = self._pool.bound
        return bound if pool is bound and bound is not None else self._pool.check("pool", pool)

    def bind_pool(self, pool: BlockPool) -> None:
        """Bind `pool` (one `check_pool` admitted) after a call with it succeeded."""
        self._pool.bind(pool)

    def publish(self, page_set: PrefixPageSet, pool: BlockPool) -> None:
        """Retain the pages, then make the set visible, then release any replaced set."""
        pool = self.check_pool(pool)
        self._publish(page_set, pool)
        self.bind_pool(pool)

    def attach(self, identity: PrefixIdentity, table: SequenceBlockTable, pool: BlockPool) -> int | None:
        """Install the prefix into `table` (all or nothing); its token count, or None on a miss."""
        pool = self.check_pool(pool)
        if not isinstance(table, SequenceBlockTable):
            raise refusals.wrong_kind("table", "SequenceBlockTable", table)
        tokens = attach_row(self, identity, get_row(table), pool)
        self.bind_pool(pool)
        return tokens

    def remove(self, identity: PrefixIdentity, pool: BlockPool) -> bool:
        """Remove the entry, releasing its page references; False when absent."""
        pool = self.check_pool(pool)
        removed = self._remove(identity, pool)
        self.bind_pool(pool)
        return removed

    def reclaim(
        self,
        pool: BlockPool,
        pages: int,
        spare: Mapping[int, int] | npt.NDArray[Any] | None = None,
        keep: Sequence[int] = (),
    ) -> int:
        """Evict idle entries LRU-first until `pages` pages are free (the spec's `reclaim`: with
        `spare`, references other evicting owners hold, per page; `keep`, pages never counted
        available); the pages freed."""
        pool = self.check_pool(pool)
        freed = self._reclaim(pool, pages, _spare_array(spare, pool.physical_pages), keep)
        self.bind_pool(pool)
        return freed

    def get(self, identity: PrefixIdentity) -> PrefixPageSet | None:
        """The page set published under `identity`, if any (does not count as a use)."""
        if not isinstance(identity, PrefixIdentity):
            return None
        entry = self._index.get(identity)
        return None if entry is None else self._page_set(entry)

    def _publish(self, page_set: PrefixPageSet, pool: BlockPool) -> None:
        if not isinstance(page_set, PrefixPageSet):
            raise refusals.wrong_kind("page_set", "PrefixPageSet", page_set)
        count = len(page_set.pages)
        if count > self._page_capacity:
            raise refusals.set_over_capacity(count, self._page_capacity)
        entry, victim = self._place_for(page_set.identity)
        occupied = entry is not None and self._identities[entry] is not None
        new_pages = self._exchange(page_set, entry if occupied else None, pool)
        if entry is None:
            release_array(pool, new_pages)  # undo: each count was >= 2
            raise refusals.store_without_entries()
        if occupied:
            old = self._identities[entry]
            assert old is not None
            del self._index[old]
        else:
            heapq.heappop(self._empty)
        if victim:
            self._next_victim += 1
        self._identities[entry] = page_set.identity
        self._index[page_set.identity] = entry
        self._pages[entry, :count] = new_pages
        self._page_counts[entry] = count
        self._token_counts[entry] = page_set.token_count
        self._last_used[entry] = self._clock
        self._clock += 1

    def _place_for(self, identity: PrefixIdentity) -> tuple[int | None, bool]:
        """The entry a publish of `identity` takes (None: the store has no entries), and whether it
        evicts a victim: the identity's own entry, else the lowest empty one, else the next victim."""
        if not self._identities:
            return None, False
        entry = self._index.get(identity)
        if entry is None:
            entry = self._empty[0] if self._empty else None
        if entry is None:
            return self._next_victim % self.entries, True
        return entry, False

    def _exchange(self, page_set: PrefixPageSet, replaced: int | None, pool: BlockPool) -> npt.NDArray[np.uint32]:
        """Retain the new set, then release the `replaced` entry's pages (None: no old set), all or
        nothing: retaining first keeps a page both sets hold from reaching 0. The new page ids."""
        retain_sequence(pool, page_set.pages)
        new_pages = np.array(page_set.pages, dtype=np.uint32)  # every id is in range: retained
        if replaced is not None:
            try:
                release_array(pool, self._pages[replaced, : self._page_counts[replaced]])
            except KvschedError:
                release_array(pool, new_pages)  # undo the retains: each count was >= 2
                raise
        return new_pages

    def _remove(self, identity: PrefixIdentity, pool: BlockPool) -> bool:
        if not isinstance(identity, PrefixIdentity):
            raise refusals.wrong_kind("identity", "PrefixIdentity", identity)
        entry = self._index.get(identity)
        if entry is None:
            return False
        self._release_entry(entry, pool)
        self._clear(entry)
        return True

    def _release_entry(self, entry: int, pool: BlockPool) -> None:
        """Release a removed entry's pages, all or nothing."""
        release_array(pool, self._pages[entry, : self._page_counts[entry]])

    def _refresh(self, entry: int) -> None:
        """An attached entry becomes the most recently used."""
        self._last_used[entry] = self._clock

    def _clear(self, entry: int) -> None:
        identity = self._identities[entry]
        assert identity is not None
        del self._index[identity]
        self._identities[entry] = None
        self._page_counts[entry] = 0
        self._token_counts[entry] = 0
        self._last_used[entry] = 0
        heapq.heappush(self._empty, entry)

    def _reclaim(
        self, pool: BlockPool, pages: int, spare: npt.NDArray[np.uint32] | None = None, keep: Sequence[int] = ()
    ) -> int:
        """Evict idle entries, least recently used first, until `pages` pages are free (or
        only `spare`'s holders hold them).

        Stops early when no idle entry is left; returns how many pages became free.
        """
        pages = require_reclaim_target(pages)
        refs = get_arrays(pool).refs
        if spare is None:
            spare = np.zeros(refs.shape[0], dtype=np.uint32)
        counted = np.ones(refs.shape[0], dtype=np.bool_)
        counted[[page for page in keep if 0 <= page < refs.shape[0]]] = False

        def available() -> int:
            return pool.free_count() + int(np.count_nonzero((spare > 0) & (refs == spare) & counted))

        before = available()
        if before >= pages:
            return 0
        occupied = np.array([identity is not None for identity in self._identities], dtype=np.bool_)
        store_refs = np.zeros(refs.shape[0], dtype=np.uint32)
        while available() < pages:
            entry = find_idle_lru(self._pages, self._page_counts, occupied, self._last_used, refs, store_refs, spare)
            if entry < 0:
                break
            release_array(pool, self._pages[entry, : self._page_counts[entry]])
            self._clear(entry)
            occupied[entry] = False
        return available() - before

    def __repr__(self) -> str:
        return f"PrefixKvStore(entries={self.entries}, pages={self._page_capacity}, occupied={len(self._index)})"


def _spare_array(spare: Mapping[int, int] | npt.NDArray[Any] | None, pages: int) -> npt.NDArray[np.uint32] | None:
    if spare is None or isinstance(spare, np.ndarray):
        return None if spare is None else spare.astype(np.uint32)
    array = np.zeros(pages, dtype=np.uint32)
    for page, count in spare.items():
        if 0 <= page < pages:
            array[page] = count
    return array


def attach_row(store: PrefixKvStore, identity: PrefixIdentity, row: TableRow, pool: BlockPool) -> int | None:
    """Install the prefix `identity` names into the empty `row`: None on a miss, else its tokens."""
    if not isinstance(identity, PrefixIdentity):
        raise refusals.wrong_kind("identity", "PrefixIdentity", identity)
    entry = store._index.get(identity)
    if entry is None:
        return None
    install_row_prefix(row, pool, store._pages[entry, : store._page_counts[entry]])
    store._refresh(entry)
    store._clock += 1
    return int(store._token_counts[entry])


Recency = tuple[int, list[tuple[int, int]]]  # the store's clock, and (entry, last use) pairs


def recency_of(store: PrefixKvStore, identities: list[PrefixIdentity | None]) -> Recency:
    """The store's clock and the last use of each entry `identities` name (None names none):
    what `restore_recency` puts back after those entries are attached."""
    index = store._index
    entries = [index[identity] for identity in identities if identity is not None and identity in index]
    return store._clock, [(entry, int(store._last_used[entry])) for entry in entries]


def restore_recency(store: PrefixKvStore, recency: Recency) -> None:
    """Put back the recency `recency_of` read."""
    clock, entries = recency
    for entry, last_used in entries:
        store._last_used[entry] = last_used
    store._clock = clock


@jit
def find_idle_lru(
    pages: npt.NDArray[np.uint32],
    page_counts: npt.NDArray[np.int64],
    occupied: npt.NDArray[np.bool_],
    last_used: npt.NDArray[np.int64],
    refs: npt.NDArray[np.uint32],
    store_refs: npt.NDArray[np.uint32],
    spare: npt.NDArray[np.uint32],
) -> int:
    """The occupied entry with the least `last_used` (then lowest index) whose pages only the
    store (and `spare`'s references) hold; -1 when none. An entry naming a page outside the
    pool is never idle."""
    size = refs.shape[0]
    store_refs[:] = 0
    for entry in range(pages.shape[0]):
        if occupied[entry]:
            for index in range(page_counts[entry]):
                page = pages[entry, index]
                if page < size:
                    store_refs[page] += 1
    best = -1
    for entry in range(pages.shape[0]):
        if not occupied[entry] or (best >= 0 and last_used[entry] >= last_used[best]):
            continue
        idle = True
        for index in range(page_counts[entry]):
            page = pages[entry, index]
            if page >= size or refs[page] != store_refs[page] + spare[page]:
                idle = False
                break
        if idle:
            best = entry
    return best


def get_indexes(
    store: PrefixKvStore,
) -> tuple[list[PrefixIdentity | None], dict[PrefixIdentity, int], list[int], npt.NDArray[np.int64]]:
    """The store's identities, identity index, empty-entry heap and page counts (for refinement)."""
    return store._identities, store._index, store._empty, store._page_counts
