"""The engine's KV events: what it tells a router about its cache (`kvsched.spec.kv_events`).

The engine's cached set is every key of its automatic prefix cache on the device and of its
host tier's cache (`cached_entries`), each with its parent and chain depth. The publisher
remembers what it published (the set as of its last batch) and whether the cache was reset
since; `take` hands over the batch that takes a consumer from what it published to what is
cached now (`changes`: `Cleared` after a reset, the entries gone, then the new ones, parents
first), numbered from 0 within the engine's restart epoch, or None when nothing changed (no
number is used). An epoch's first batch opens with `Cleared`, so the engine announces a restart
with its first batch, whether or not it has cached anything yet. `snapshot` is the published
set, for a consumer that missed a batch.

A failed step changes nothing the publisher reads, so it publishes nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvsched.spec import refusals
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_state import EngineState
from kvsched.spec.kv_events import DEVICE, HOST, TIER_NAMES, Entry, EventBatch, Key, Snapshot, changes

Published = Mapping[Entry, tuple[Key | None, int]]  # (key, tier) -> (parent, depth)


def cached_entries(state: EngineState) -> dict[Entry, tuple[Key | None, int]]:
    """The engine's cached set: each device and host cache entry with its parent and depth."""
    entries: dict[Entry, tuple[Key | None, int]] = {
        (page.key, DEVICE): (page.parent, page.depth) for page in state.system.cache.pages
    }
    entries.update({(page.key, HOST): (page.parent, page.depth) for page in state.host.cache})
    return entries


def snapshot_of(engine: str, epoch: int, next_seq: int, published: Published) -> Snapshot:
    """A snapshot of `published`, in canonical order (tier, depth, key)."""
    order = sorted(published.items(), key=lambda item: (TIER_NAMES.index(item[0][1]), item[1][1], repr(item[0][0])))
    return Snapshot(engine, epoch, next_seq, tuple((key, tier, parent) for (key, tier), (parent, _) in order))


class Publisher:
    """One engine's event stream (see the module docstring)."""

    def __init__(self, engine: object, epoch: object, tokens: int) -> None:
        if not isinstance(engine, str) or not engine:
            raise refusals.malformed_events(f"an engine is named by a non-empty str, not {engine!r}")
        self.engine, self.epoch, self.tokens = engine, require_u64("epoch", epoch), tokens
        self.next_seq = 0
        self.published: dict[Entry, tuple[Key | None, int]] = {}
        self.cleared = True  # the cache was reset since the last batch (a new epoch starts from nothing)

    def reset(self) -> None:
        """The engine's caches were reset."""
        self.cleared = True

    def take(self, cached: Published) -> EventBatch | None:
        """The batch from what was published to `cached` (None: nothing changed)."""
        return self.publish(self.published.keys(), cached)

    def publish(self, before: Iterable[Entry], now: Published) -> EventBatch | None:
        """The batch that replaces the published entries `before` by `now` (every entry not in
        `before` is as published, and stays so)."""
        before = frozenset(before)
        events = changes(before, now, self.tokens, self.cleared)
        if self.cleared:
            self.published.clear()
        for entry in before:
            self.published.pop(entry, None)
        self.published.update(now)
        self.cleared = False
        if not events:
            return None
        batch = EventBatch(self.engine, self.epoch, self.next_seq, events)
        self.next_seq += 1
        return batch

    def snapshot(self) -> Snapshot:
        """What was published, as of the batch published next."""
        return snapshot_of(self.engine, self.epoch, self.next_seq, self.published)

    def __repr__(self) -> str:
        return f"Publisher({self.engine!r}, epoch {self.epoch}, next {self.next_seq}, {len(self.published)} published)"
