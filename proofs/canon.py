"""Canonical states: one representative per class of states that behave identically.

Three symmetries shrink the explored space without hiding a bug:
- request ids only meet each other in equality tests, and the alphabet holds every id
  0..requests, so renaming live ids by first appearance (slot order) is a bijection of the
  alphabet that maps successors to successors;
- prefix identities likewise (entries in slot order);
- the store's clock only orders `last_used` values, so replacing them (and the clock) by their
  ranks keeps every comparison, and `next_victim` only matters modulo the entry count.
Pages are not symmetric (the free stack's order is observable), so they are never renamed.

Every spec invariant is preserved exactly by these maps (a duplicate id stays a duplicate, an
entry used "after" the clock stays after it), so checking the canonical state is checking the
state. Canonical values are interned: states share their unchanged parts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvsched.proofs.operations import Bounds
from kvsched.proofs.operations import identity as prefix_identity
from kvsched.spec.prefix import PrefixIdentity, StoreEntry, StoreState
from kvsched.spec.scheduler import SchedulerState, Slot, is_live
from kvsched.spec.system import SystemState


@dataclass(frozen=True)
class Renaming:
    """How a state's request ids and identity indices map to the canonical state's."""

    ids: dict[int, int]
    identities: dict[int, int]

    def inverse(self) -> Renaming:
        """The map back from canonical to this state's names."""
        return Renaming({b: a for a, b in self.ids.items()}, {b: a for a, b in self.identities.items()})


def _permutation(first_seen: list[int], domain: range) -> dict[int, int]:
    order = list(dict.fromkeys(value for value in first_seen if value in domain))
    order += [value for value in domain if value not in order]
    return {value: index for index, value in enumerate(order)}


class Canonicalizer:
    """Maps states to canonical representatives for one set of bounds, interning their parts."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._identity_index = {prefix_identity(i): i for i in bounds.identities}
        self._interned: dict[Any, Any] = {}
        self._schedulers: dict[SchedulerState, tuple[SchedulerState, dict[int, int]]] = {}
        self._stores: dict[StoreState, tuple[StoreState, dict[int, int]]] = {}
        self._identity_ids = {value: value for value in bounds.request_ids}
        self._identity_identities = {value: value for value in bounds.identities}

    def intern(self, value: Any) -> Any:
        """One shared object per distinct value (states are mostly unchanged parts)."""
        return self._interned.setdefault(value, value)

    def renaming(self, state: SystemState) -> Renaming:
        """The renaming that takes `state` to its canonical form."""
        return self.canonical(state)[1]

    def index_of(self, identity: PrefixIdentity) -> int:
        """The alphabet index of a prefix identity."""
        return self._identity_index[identity]

    def _slot(self, slot: Slot, ids: dict[int, int]) -> Slot:
        if is_live(slot) and slot.request_id in ids:
            slot = replace(slot, request_id=ids[slot.request_id])
        return self.intern(slot)  # type: ignore[no-any-return]

    def _identity(self, identity: PrefixIdentity, identities: dict[int, int]) -> PrefixIdentity:
        index = self._identity_index.get(identity)
        return identity if index is None else prefix_identity(identities[index])

    def _store(self, store: StoreState, identities: dict[int, int]) -> StoreState:
        times = sorted({entry.last_used for entry in store.slots if entry is not None} | {store.clock})
        rank = {time: index for index, time in enumerate(times)}
        slots = tuple(
            None
            if entry is None
            else self.intern(
                StoreEntry(
                    replace(entry.page_set, identity=self._identity(entry.page_set.identity, identities)),
                    rank[entry.last_used],
                )
            )
            for entry in store.slots
        )
        victim = store.next_victim % len(store.slots) if store.slots else store.next_victim
        return self.intern(StoreState(slots, store.page_capacity, victim, rank[store.clock]))  # type: ignore[no-any-return]

    def canonical(self, state: SystemState, like: SystemState | None = None) -> tuple[SystemState, Renaming]:
        """The canonical representative of `state` and the renaming that produced it.

        `like` is a canonical state `state` was derived from: a part it shares by identity is
        already canonical (most operations change one part), which saves rebuilding it.
        """
        if like is not None and state.scheduler is like.scheduler:
            scheduler, ids = like.scheduler, self._identity_ids
        else:
            scheduler, ids = self._canonical_scheduler(state.scheduler)
        if like is not None and state.store is like.store:
            store, identities = like.store, self._identity_identities
        else:
            store, identities = self._canonical_store(state.store)
        canonical = SystemState(self.intern(state.pool), store, scheduler, self.intern(state.external))
        return canonical, Renaming(ids, identities)

    def _canonical_scheduler(self, scheduler: SchedulerState) -> tuple[SchedulerState, dict[int, int]]:
        cached = self._schedulers.get(scheduler)
        if cached is None:
            live = [slot.request_id for slot in scheduler.slots if is_live(slot)]
            ids = _permutation(live, self.bounds.request_ids)
            renamed = SchedulerState(tuple(self._slot(slot, ids) for slot in scheduler.slots))
            cached = self._schedulers.setdefault(scheduler, (self.intern(renamed), ids))
        return cached

    def _canonical_store(self, store: StoreState) -> tuple[StoreState, dict[int, int]]:
        cached = self._stores.get(store)
        if cached is None:
            published = [
                self._identity_index.get(entry.page_set.identity, -1) for entry in store.slots if entry is not None
            ]
            identities = _permutation(published, self.bounds.identities)
            cached = self._stores.setdefault(store, (self._store(store, identities), identities))
        return cached
