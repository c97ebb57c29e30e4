"""Canonical states: one representative per class of states that behave identically.

Four symmetries shrink the explored space without hiding a bug:
- request ids only meet each other in equality tests, and the alphabet holds every id
  0..requests, so renaming live ids by first appearance (slot order) is a bijection of the
  alphabet that maps successors to successors;
- prefix identities likewise (entries in slot order);
- the store's clock only orders `last_used` values, so replacing them (and the clock) by their
  ranks keeps every comparison, and `next_victim` only matters modulo the entry count;
- physical pages. The spec (pool.py, table.py, prefix.py, scheduler.py) uses a page id only to
  index `refs`, to test it against the pool's range, to compare it with another page (a set's
  repeated pages, `count(page)`) and to move it between the free stack, tables, entries and the
  external holds; it never orders, adds or hashes page ids into a decision. The free stack's
  order is observable, but a permutation π of 0..pages-1 keeps it: π maps the stack to the
  stack of π-images (same order), `refs` to `refs∘π⁻¹`, every table, entry page list and hold to
  its image, and a successor of a state by operation `o` to the π-image of a successor by
  `π(o)`. The decode backend reads a page only to test it against `INVALID_BLOCK`. The
  alphabet is closed under π: `ext_retain` tries every page, `publish` every arrangement of up
  to `entry_pages` distinct pages, and the rest name no page in range (the out-of-range set is
  fixed by π; the over-capacity set is refused for its length before any page is read, the same
  error for every image; the batches name no page). The initial state is a single state: its
  stack order (pages-1 ... 1, 0) is a fact of that state, not a constraint on the renaming, so
  the classes reachable from it are exactly the classes of the reachable states.
  Pages are renamed by first appearance: the free stack bottom to top, then every table in slot
  and logical order, then every entry's pages in slot order; pages seen nowhere there (held only
  externally, or leaked) follow, ordered by their external multiplicity and reference count,
  which is everything that distinguishes them, so swapping two of equal rank is an
  automorphism and the tie-break by id is invisible.

The decode round keeps the id symmetry: the backend finds every output set to the spec's
`UNANSWERED` (slot 2**32 - 1, which no scheduler has), so a backend that writes nothing
(`decode("no_write", "")`) is refused whatever the ids and slots. (A zeroed record, the rule
before, passed for request 0 in slot 0 and broke the symmetry there; the explorer found it.)

Every spec invariant and post-condition the explorer checks is preserved exactly by these maps
(a duplicate id stays a duplicate, an entry used "after" the clock stays after it, a page's
count still equals its owners' references), so checking the canonical state is checking every
state of its class. The canonical state itself may be unreachable (its free stack runs 0, 1,
2, ... from the bottom): the explorer loads it into systems made of spec objects, whose
operations commute with renaming (tests/proofs/test_canon.py checks every operation on
reachable states), and replays any other system (impl) along the path in its own names, so
that system only runs reachable states; that it is symmetric too is assumed, as for ids, and
checked in lockstep from one state of each class. Canonical values are interned: states share
their unchanged parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvsched.proofs.operations import Bounds
from kvsched.proofs.operations import identity as prefix_identity
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import PrefixPageSet, StoreEntry, StoreState
from kvsched.spec.slots import RequestState, SchedulerState, Slot
from kvsched.spec.system import SystemState

EMPTY = RequestState.EMPTY
Permutation = tuple[int, ...]  # new name of page p at index p


T = TypeVar("T")


@dataclass(frozen=True)
class Renaming:
    """How a state's request ids, identity indices and pages map to the canonical state's."""

    ids: dict[int, int]
    identities: dict[int, int]
    pages: dict[int, int] = field(default_factory=dict)

    def inverse(self) -> Renaming:
        """The map back from canonical to this state's names."""
        return Renaming(
            {b: a for a, b in self.ids.items()},
            {b: a for a, b in self.identities.items()},
            {b: a for a, b in self.pages.items()},
        )


def _permutation(first_seen: list[int], domain: range) -> dict[int, int]:
    order = list(dict.fromkeys(value for value in first_seen if value in domain))
    order += [value for value in domain if value not in order]
    return {value: index for index, value in enumerate(order)}


def _map_pages(pages: tuple[int, ...], perm: Permutation) -> tuple[int, ...]:
    size = len(perm)
    return tuple(perm[page] if 0 <= page < size else page for page in pages)


class Canonicalizer:
    """Maps states to canonical representatives for one set of bounds, interning their parts."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._identity_index = {prefix_identity(i): i for i in bounds.identities}
        self._interned: dict[Any, Any] = {}
        self._schedulers: dict[tuple[SchedulerState, Permutation], tuple[SchedulerState, dict[int, int]]] = {}
        self._stores: dict[tuple[StoreState, Permutation], tuple[StoreState, dict[int, int]]] = {}
        self._pools: dict[tuple[PoolState, Permutation], PoolState] = {}
        self._identity_ids = {value: value for value in bounds.request_ids}
        self._identity_identities = {value: value for value in bounds.identities}
        self._in_range = frozenset(range(bounds.pages))
        self._no_renaming: Permutation = tuple(range(bounds.pages))
        self._identity_pages = dict(enumerate(self._no_renaming))

    def intern(self, value: T) -> T:
        """One shared object per distinct value (states are mostly unchanged parts)."""
        shared: T = self._interned.setdefault(value, value)
        return shared

    def key(self, canonical: SystemState) -> tuple[int, int, int, int]:
        """A cheap dictionary key for a canonical state of this canonicalizer.

        Its parts are interned (one object per value, kept alive here), so their identities
        determine the state and nothing needs hashing the whole state again.
        """
        return id(canonical.pool), id(canonical.store), id(canonical.scheduler), id(canonical.external)

    def renaming(self, state: SystemState) -> Renaming:
        """The renaming that takes `state` to its canonical form."""
        return self.canonical(state)[1]

    def index_of(self, identity: PrefixIdentity) -> int:
        """The alphabet index of a prefix identity."""
        return self._identity_index[identity]

    def page_permutation(self, state: SystemState) -> Permutation:
        """The canonical name of every page of `state`, by first appearance (see the module)."""
        valid = self._in_range
        rank: dict[int, int] = {}
        for page in state.pool.free:
            if page in valid and page not in rank:
                rank[page] = len(rank)
        for slot in state.scheduler.slots:
            for entry in slot.table:
                if entry in valid and entry not in rank:
                    rank[entry] = len(rank)
        for stored in state.store.entries:
            if stored is not None:
                for page in stored.page_set.pages:
                    if page in valid and page not in rank:
                        rank[page] = len(rank)
        pages = self._no_renaming
        if len(rank) < len(pages):
            external, refs = state.external, state.pool.refs
            rest = sorted((page for page in pages if page not in rank), key=lambda p: (external.count(p), refs[p], p))
            for page in rest:
                rank[page] = len(rank)
        return tuple(rank[page] for page in pages)

    def _slot(self, slot: Slot, ids: dict[int, int], perm: Permutation | None) -> Slot:
        if slot.state is EMPTY and (perm is None or all(entry is None for entry in slot.table)):
            return self.intern(slot)
        table = slot.table
        if perm is not None:
            size = len(perm)
            table = tuple(entry if entry is None or not 0 <= entry < size else perm[entry] for entry in slot.table)
        request_id = ids.get(slot.request_id, slot.request_id) if slot.state is not EMPTY else slot.request_id
        renamed = Slot(
            table,
            request_id,
            slot.state,
            slot.token_count,
            slot.prefix_tokens,
            slot.next_token_id,
            slot.token_ready,
        )
        return self.intern(renamed)

    def _identity(self, identity: PrefixIdentity, identities: dict[int, int]) -> PrefixIdentity:
        index = self._identity_index.get(identity)
        return identity if index is None else prefix_identity(identities[index])

    def _entry(self, entry: StoreEntry, identities: dict[int, int], perm: Permutation | None, time: int) -> StoreEntry:
        page_set = entry.page_set
        pages = page_set.pages if perm is None else _map_pages(page_set.pages, perm)
        renamed = PrefixPageSet(self._identity(page_set.identity, identities), pages, page_set.token_count)
        return self.intern(StoreEntry(renamed, time))

    def _store(self, store: StoreState, identities: dict[int, int], perm: Permutation | None) -> StoreState:
        times = sorted({entry.last_used for entry in store.entries if entry is not None} | {store.clock})
        rank = {time: index for index, time in enumerate(times)}
        slots = tuple(
            None if entry is None else self._entry(entry, identities, perm, rank[entry.last_used])
            for entry in store.entries
        )
        victim = store.next_victim % len(store.entries) if store.entries else store.next_victim
        return self.intern(StoreState(slots, store.page_capacity, victim, rank[store.clock]))

    def canonical(self, state: SystemState, like: SystemState | None = None) -> tuple[SystemState, Renaming]:
        """The canonical representative of `state` and the renaming that produced it.

        `like` is a canonical state `state` was derived from: when the pages keep their names,
        a part it shares by identity is already canonical (most operations change one part),
        which saves rebuilding it.
        """
        perm = self.page_permutation(state)
        if perm == self._no_renaming:
            return self._canonical_names(state, like)
        scheduler, ids = self._canonical_scheduler(state.scheduler, perm)
        store, identities = self._canonical_store(state.store, perm)
        key = (state.pool, perm)
        pool = self._pools.get(key)
        if pool is None:
            inverse = sorted(range(len(perm)), key=perm.__getitem__)
            refs = tuple(state.pool.refs[page] for page in inverse)
            renamed = PoolState(refs, _map_pages(state.pool.free, perm), state.pool.max_references)
            pool = self._pools.setdefault(key, self.intern(renamed))
        external = self.intern(tuple(sorted(_map_pages(state.external, perm))))
        pages = dict(enumerate(perm))
        return SystemState(pool, store, scheduler, external), Renaming(ids, identities, pages)

    def _canonical_names(self, state: SystemState, like: SystemState | None) -> tuple[SystemState, Renaming]:
        """`canonical` for a state whose pages already have their canonical names."""
        if like is not None and state.scheduler is like.scheduler:
            scheduler, ids = like.scheduler, self._identity_ids
        else:
            scheduler, ids = self._canonical_scheduler(state.scheduler, None)
        if like is not None and state.store is like.store:
            store, identities = like.store, self._identity_identities
        else:
            store, identities = self._canonical_store(state.store, None)
        canonical = SystemState(self.intern(state.pool), store, scheduler, self.intern(state.external))
        return canonical, Renaming(ids, identities, self._identity_pages)

    def _canonical_scheduler(
        self, scheduler: SchedulerState, perm: Permutation | None
    ) -> tuple[SchedulerState, dict[int, int]]:
        key = (scheduler, perm or self._no_renaming)
        cached = self._schedulers.get(key)
        if cached is None:
            live = [slot.request_id for slot in scheduler.slots if slot.state is not EMPTY]
            ids = _permutation(live, self.bounds.request_ids)
            renamed = SchedulerState(tuple(self._slot(slot, ids, perm) for slot in scheduler.slots))
            cached = self._schedulers.setdefault(key, (self.intern(renamed), ids))
        return cached

    def _canonical_store(self, store: StoreState, perm: Permutation | None) -> tuple[StoreState, dict[int, int]]:
        key = (store, perm or self._no_renaming)
        cached = self._stores.get(key)
        if cached is None:
            published = [
                self._identity_index.get(entry.page_set.identity, -1) for entry in store.entries if entry is not None
            ]
            identities = _permutation(published, self.bounds.identities)
            cached = self._stores.setdefault(key, (self._store(store, identities, perm), identities))
        return cached
