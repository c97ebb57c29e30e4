"""Named shared prefixes: page sets and the fixed-capacity prefix store (identities: `identity`).

Modelled: a registry of at most `entries` prefix page sets, each keyed by a `PrefixIdentity`
and owning one pool reference on each of its pages. A request attaching a prefix retains the
pages once more in its own table, so removing or replacing an entry never invalidates a request
that is still reading it; the first write to a shared page goes through copy-on-write.

Ordering promises: `publish` retains the new pages before the set becomes visible and releases a
replaced set only after; a full registry replaces round-robin; `reclaim` evicts only idle entries
(pages no one but the store holds), least recently used first, ties to the lowest slot.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from kvsched.spec import pool as pool_ops
from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.binding import Binding
from kvsched.spec.domain import as_int, require_size
from kvsched.spec.errors import EmptyPageSet, InvalidArgument, PageCapacity
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.pool import BlockPool, PoolState
from kvsched.spec.table import SequenceBlockTable, Table, install_shared_prefix

MAX_SET_PAGES = 2**16 - 1  # the original stores page_count as u16
MAX_ENTRIES = 2**16


@dataclass(frozen=True, slots=True)
class PrefixPageSet:
    """The pages holding one prefix's KV, in logical order, and how many tokens they hold."""

    identity: PrefixIdentity
    pages: tuple[int, ...]
    token_count: int

    def __post_init__(self) -> None:
        if not isinstance(self.identity, PrefixIdentity):
            raise InvalidArgument("a page set needs a PrefixIdentity")
        pages = tuple(as_int(page) for page in self.pages) if isinstance(self.pages, tuple) else (None,)
        if any(page is None for page in pages):
            raise InvalidArgument("a page set's pages are a tuple of integers")
        object.__setattr__(self, "pages", pages)
        if not self.pages:
            raise EmptyPageSet("a prefix page set needs at least one page")
        if len(set(self.pages)) != len(self.pages):
            raise InvalidArgument(f"pages {self.pages} repeat a page: one page cannot hold two positions")
        if len(self.pages) > MAX_SET_PAGES:
            raise PageCapacity(f"{len(self.pages)} pages exceed the {MAX_SET_PAGES}-page limit")
        token_count = as_int(self.token_count)
        if token_count is None or not 1 <= token_count <= U32_MAX:
            raise EmptyPageSet(f"a prefix must hold 1..2**32-1 tokens, not {self.token_count!r}")
        object.__setattr__(self, "token_count", token_count)


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """An occupied registry slot: the page set and when it was last published or attached."""

    page_set: PrefixPageSet
    last_used: int


@dataclass(frozen=True, slots=True)
class StoreState:
    """The store's entries (None = empty), per-entry page capacity, round-robin cursor, LRU clock."""

    entries: tuple[StoreEntry | None, ...]
    page_capacity: int
    next_victim: int = 0
    clock: int = 0


def initial_store(entries: int, pages: int) -> StoreState:
    """An empty store of `entries` slots, each holding at most `pages` pages."""
    entries = require_size("entries", entries, 0, MAX_ENTRIES)
    pages = require_size("pages", pages, 1, MAX_SET_PAGES)
    return StoreState(entries=(None,) * entries, page_capacity=pages)


def find_entry(state: StoreState, identity: PrefixIdentity) -> int | None:
    """The entry holding `identity`, if any."""
    for index, entry in enumerate(state.entries):
        if entry is not None and entry.page_set.identity == identity:
            return index
    return None


def get_store_references(state: StoreState, page: int) -> int:
    """How many references the store's entries hold on `page`."""
    return sum(entry.page_set.pages.count(page) for entry in state.entries if entry is not None)


def _with_entry(state: StoreState, index: int, entry: StoreEntry | None) -> tuple[StoreEntry | None, ...]:
    return state.entries[:index] + (entry,) + state.entries[index + 1 :]


def _release_set(pool: PoolState, entry: StoreEntry | None) -> PoolState:
    if entry is not None:
        for page in entry.page_set.pages:
            pool = pool_ops.release(pool, page)
    return pool


def publish(state: StoreState, pool: PoolState, page_set: PrefixPageSet) -> tuple[StoreState, PoolState]:
    """Make `page_set` visible under its identity, replacing a same-identity or victim entry."""
    if not isinstance(page_set, PrefixPageSet):
        raise refusals.wrong_kind("page_set", "PrefixPageSet", page_set)
    if len(page_set.pages) > state.page_capacity:
        raise refusals.set_over_capacity(len(page_set.pages), state.page_capacity)
    for page in page_set.pages:
        pool = pool_ops.retain(pool, page)
    if not state.entries:
        raise refusals.store_without_entries()
    index = find_entry(state, page_set.identity)
    next_victim = state.next_victim
    if index is None:
        index = next((i for i, entry in enumerate(state.entries) if entry is None), None)
    if index is None:
        index = next_victim % len(state.entries)
        next_victim += 1
    replaced = state.entries[index]
    entry = StoreEntry(page_set=page_set, last_used=state.clock)
    state = replace(state, entries=_with_entry(state, index, entry), next_victim=next_victim, clock=state.clock + 1)
    return state, _release_set(pool, replaced)


def attach(
    state: StoreState, table: Table, pool: PoolState, identity: PrefixIdentity
) -> tuple[StoreState, Table, PoolState, int | None]:
    """Install the prefix's pages into the empty `table`: a miss gives None, a hit its tokens."""
    if not isinstance(identity, PrefixIdentity):
        raise refusals.wrong_kind("identity", "PrefixIdentity", identity)
    index = find_entry(state, identity)
    if index is None:
        return state, table, pool, None
    entry = state.entries[index]
    assert entry is not None
    table, pool = install_shared_prefix(table, pool, entry.page_set.pages)
    touched = StoreEntry(page_set=entry.page_set, last_used=state.clock)
    state = replace(state, entries=_with_entry(state, index, touched), clock=state.clock + 1)
    return state, table, pool, entry.page_set.token_count


def remove(state: StoreState, pool: PoolState, identity: PrefixIdentity) -> tuple[StoreState, PoolState, bool]:
    """Drop the entry and its page references; False when absent."""
    if not isinstance(identity, PrefixIdentity):
        raise refusals.wrong_kind("identity", "PrefixIdentity", identity)
    index = find_entry(state, identity)
    if index is None:
        return state, pool, False
    pool = _release_set(pool, state.entries[index])
    return replace(state, entries=_with_entry(state, index, None)), pool, True


def is_idle(state: StoreState, pool: PoolState, entry: StoreEntry, spare: Mapping[int, int] | None = None) -> bool:
    """Only the store (and `spare`'s holders: the automatic cache, which evicts what it alone
    holds) holds the entry's pages: evicting it frees every one of them or leaves it evictable
    (an entry naming pages outside `pool`, a store used with another pool, is never idle)."""
    pages = entry.page_set.pages
    spare = spare or {}
    in_range = all(0 <= page < len(pool.refs) for page in pages)
    return in_range and all(pool.refs[page] == get_store_references(state, page) + spare.get(page, 0) for page in pages)


def droppable(state: StoreState, pool: PoolState, spare: Mapping[int, int] | None = None) -> PrefixIdentity | None:
    """The least recently used entry that alone (with `spare`'s holders) holds one of its pages,
    though a request may share the others: removing it frees that page, which reclaiming cannot
    (the entry is not idle). None when no entry does."""
    spare = spare or {}

    def alone(page: int) -> bool:
        return 0 <= page < len(pool.refs) and pool.refs[page] == get_store_references(state, page) + spare.get(page, 0)

    found = [
        (entry.last_used, index)
        for index, entry in enumerate(state.entries)
        if entry is not None and any(alone(page) for page in entry.page_set.pages)
    ]
    if not found:
        return None
    entry = state.entries[min(found)[1]]
    assert entry is not None
    return entry.page_set.identity


def available_pages(pool: PoolState, spare: Mapping[int, int], keep: Collection[int] = ()) -> int:
    """Free pages, and pages only `spare`'s holders hold (as good as free: they evict them),
    but for those in `keep` (an admission is about to reuse them: they stay)."""
    return len(pool.free) + sum(
        1 for page, count in spare.items() if count and pool.refs[page] == count and page not in keep
    )


def require_reclaim_target(pages: object) -> int:
    """`pages` as a non-negative int, else `InvalidArgument`."""
    target = as_int(pages)
    if target is None or target < 0:
        raise InvalidArgument(f"reclaim target must be a non-negative integer, not {pages!r}")
    return target


def reclaim(
    state: StoreState,
    pool: PoolState,
    pages: int,
    spare: Mapping[int, int] | None = None,
    keep: Collection[int] = (),
) -> tuple[StoreState, PoolState, int]:
    """Evict idle entries, least recently used first, until `pages` pages are free (or, with
    `spare`, available: see `available_pages`; a page in `keep` is never counted available,
    though `spare`'s hold on it still leaves its entry idle).

    Stops early when no idle entry is left (a partial reclaim is still useful under pressure);
    returns how many pages became free (available).
    """
    pages = require_reclaim_target(pages)
    spare = spare or {}
    before = available_pages(pool, spare, keep)
    while available_pages(pool, spare, keep) < pages:
        idle = [
            (entry.last_used, index)
            for index, entry in enumerate(state.entries)
            if entry is not None and is_idle(state, pool, entry, spare)
        ]
        if not idle:
            break
        _, index = min(idle)
        pool = _release_set(pool, state.entries[index])
        state = replace(state, entries=_with_entry(state, index, None))
    return state, pool, available_pages(pool, spare, keep) - before


class PrefixKvStore:
    """Fixed-capacity prefix store with explicit physical-page ownership, bound to one pool
    (`kvsched.spec.binding`): the one it is constructed with, or the first a call succeeds with."""

    def __init__(self, entries: int, pages: int, *, pool: BlockPool | None = None) -> None:
        self._state = initial_store(entries, pages)
        self._pool = Binding(BlockPool, "prefix store")
        if pool is not None:
            self._pool.bind(self._pool.check("pool", pool))

    def check_pool(self, pool: object) -> BlockPool:
        """`pool`, if it is a `BlockPool` this store may work with; else `InvalidArgument`."""
        return self._pool.check("pool", pool)

    def bind_pool(self, pool: BlockPool) -> None:
        """Bind `pool` (one `check_pool` admitted) after a call with it succeeded."""
        self._pool.bind(pool)

    @property
    def state(self) -> StoreState:
        """The whole store state (a frozen value)."""
        return self._state

    def commit(self, state: StoreState) -> None:
        """Install a state produced by a spec transition."""
        self._state = state

    def get(self, identity: PrefixIdentity) -> PrefixPageSet | None:
        """The page set published under `identity`, if any (does not count as a use)."""
        index = find_entry(self._state, identity)
        entry = None if index is None else self._state.entries[index]
        return None if entry is None else entry.page_set

    def publish(self, page_set: PrefixPageSet, pool: BlockPool) -> None:
        """Retain the pages, then make the set visible, then release any replaced set."""
        pool = self.check_pool(pool)
        self._state, pool_state = publish(self._state, pool.state, page_set)
        pool.commit(pool_state)
        self.bind_pool(pool)

    def attach(self, identity: PrefixIdentity, table: SequenceBlockTable, pool: BlockPool) -> int | None:
        """Install the prefix into `table` (all or nothing); its token count, or None on a miss."""
        pool = self.check_pool(pool)
        if not isinstance(table, SequenceBlockTable):
            raise refusals.wrong_kind("table", "SequenceBlockTable", table)
        self._state, entries, pool_state, tokens = attach(self._state, table.state, pool.state, identity)
        table.commit(entries)
        pool.commit(pool_state)
        self.bind_pool(pool)
        return tokens

    def remove(self, identity: PrefixIdentity, pool: BlockPool) -> bool:
        """Remove the entry, releasing its page references; False when absent."""
        pool = self.check_pool(pool)
        self._state, pool_state, removed = remove(self._state, pool.state, identity)
        pool.commit(pool_state)
        self.bind_pool(pool)
        return removed

    def reclaim(
        self, pool: BlockPool, pages: int, spare: Mapping[int, int] | None = None, keep: Collection[int] = ()
    ) -> int:
        """Evict idle entries LRU-first until `pages` pages are free (`reclaim`); the pages freed."""
        pool = self.check_pool(pool)
        self._state, pool_state, freed = reclaim(self._state, pool.state, pages, spare, keep)
        pool.commit(pool_state)
        self.bind_pool(pool)
        return freed
