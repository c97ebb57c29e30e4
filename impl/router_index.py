"""The router's index, built for a router's hot path: the spec's `kvsched.spec.router_index`.

Same operations, verdicts and refusals. What differs is storage: a view is changed in place (a
batch that contradicts it is checked against the view before anything is applied), and each
view keeps how many tiers hold each key, so a prefix lookup is one dict probe a key.
`to_spec()` is the abstraction function to the spec's `IndexState`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsched.spec.kv_events import Cleared, Entry, EventBatch, Key, KvEvent, Stored, require_batch, require_snapshot
from kvsched.spec.router_index import IndexState, Verdict, View, require_keys, require_source, snapshot_is_late


@dataclass(slots=True)
class _View:
    epoch: int
    next_seq: int
    entries: set[Entry] = field(default_factory=set)
    tiers: dict[Key, int] = field(default_factory=dict)  # key -> how many tiers hold it
    stale: bool = False

    def clear(self) -> None:
        self.entries.clear()
        self.tiers.clear()

    def holds(self, key: Key) -> bool:
        return key in self.tiers

    def contradicted_by(self, batch: EventBatch) -> bool:
        """Whether applying `batch` would store an entry held or remove one not held."""
        touched: dict[Entry, bool] = {}
        for event in batch.events:
            if isinstance(event, Cleared):
                touched = dict.fromkeys(self.entries, False)
                continue
            entry = (event.key, event.tier)
            held = touched.get(entry, entry in self.entries)
            if held == isinstance(event, Stored):
                return True
            touched[entry] = not held
        return False

    def apply(self, batch: EventBatch) -> None:
        """Fold `batch` (`contradicted_by` said it may be): its events, then its number."""
        self.apply_events(batch.events)
        self.epoch, self.next_seq = batch.epoch, batch.seq + 1

    def apply_events(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if isinstance(event, Cleared):
                self.clear()
            elif isinstance(event, Stored):
                self.entries.add((event.key, event.tier))
                self.tiers[event.key] = self.tiers.get(event.key, 0) + 1
            else:
                self.entries.discard((event.key, event.tier))
                count = self.tiers[event.key] - 1
                if count:
                    self.tiers[event.key] = count
                else:
                    del self.tiers[event.key]


class RouterIndex:
    """Each engine's view, folded from its batches; see the module docstring."""

    def __init__(self) -> None:
        self.views: dict[str, _View] = {}

    def to_spec(self) -> IndexState:
        """The abstraction function: this index as the spec's `IndexState`."""
        return IndexState(
            tuple(
                (name, View(view.epoch, view.next_seq, frozenset(view.entries), view.stale))
                for name, view in sorted(self.views.items())
            )
        )

    def fold(self, source: object, batch: object) -> Verdict:
        """`batch`, arriving on `source`'s stream, folded into its view (the spec's `fold`)."""
        source = require_source(source)
        batch = require_batch(batch)
        if batch.engine != source:
            return Verdict.FOREIGN
        view = self.views.get(source)
        if view is None or batch.epoch > view.epoch:  # an engine first heard from, or restarted
            verdict = Verdict.FOLDED if view is None else Verdict.RESTARTED
            view = self.views[source] = _View(batch.epoch, 0)
            if batch.seq != 0:
                view.stale = True
                return Verdict.GAP
        elif batch.epoch < view.epoch:
            return Verdict.LATE
        elif batch.seq < view.next_seq:
            return Verdict.DUPLICATE
        elif view.stale:
            return Verdict.STALE
        elif batch.seq > view.next_seq:
            view.stale = True
            return Verdict.GAP
        else:
            verdict = Verdict.FOLDED
        if view.contradicted_by(batch):
            view.stale = True
            return Verdict.CONTRADICTS
        view.apply(batch)
        return verdict

    def resync(self, source: object, snapshot: object) -> Verdict:
        """`snapshot` replaces `source`'s view (the spec's `resync`)."""
        source = require_source(source)
        snapshot = require_snapshot(snapshot)
        if snapshot.engine != source:
            return Verdict.FOREIGN
        view = self.views.get(source)
        if view is not None and snapshot_is_late(snapshot, view.epoch, view.next_seq, view.stale):
            return Verdict.LATE
        fresh = _View(snapshot.epoch, snapshot.next_seq, set(snapshot.entries()))
        for key, _ in fresh.entries:
            fresh.tiers[key] = fresh.tiers.get(key, 0) + 1
        self.views[source] = fresh
        return Verdict.RESYNCED

    def longest_prefix(self, engine: object, keys: object) -> int:
        """How many of `keys`' leading keys `engine` holds on any tier (the spec's)."""
        engine = require_source(engine)
        keys = require_keys(keys)
        view = self.views.get(engine)
        if view is None or view.stale:
            return 0
        tiers = view.tiers
        for count, key in enumerate(keys):
            if key not in tiers:
                return count
        return len(keys)

    def route(self, keys: object) -> tuple[str | None, int]:
        """The engine holding the longest prefix of `keys` (the spec's `route`)."""
        keys = require_keys(keys)
        best: tuple[str | None, int] = (None, 0)
        for engine in sorted(self.views):
            held = self.longest_prefix(engine, keys)
            if held > best[1]:
                best = (engine, held)
        return best

    def __repr__(self) -> str:
        stale = sum(view.stale for view in self.views.values())
        return f"RouterIndex({len(self.views)} engines, {stale} stale)"
