"""The live checker at a step's cost: what each step changed, and the whole pool every N steps.

`LiveChecker` reads the whole pool at every step. `DeltaChecker` wraps one and, between its whole
checks, reads in place only what the step changed: the table entries each request gained (a
full-attention table only grows: one kept is compared by its length and cached count), the
tables that left, the references connectors' copies gained or lost, and the KV events the pool
published. It keeps each block's holders (tables and copies) and keys from step to step, and
for every block the step touched it requires:

    its count be its holders'              (refcount)
    it be queued free exactly when nothing holds it, and in the release's order among its
    neighbours in the queue                (free_in_table, free_queue, free_order)
    every key it gained be named for it in the map, every key it lost no longer named for it
                                           (cache_map)

and, for each request whose table or cached blocks changed, that the blocks it cached since
carry their tokens' key under the tokens, parent and salt first seen (ghost_content, salt), and
that the blocks past them carry no key but their own (stale_key); then the totals: the free
queue counts the blocks nothing holds, the map holds exactly the keys the blocks carry, a
finished request holds nothing (finished_leftover), and the events' net change is the blocks'
net change of keys, in the events' form (kv_events).

A reading that is off is not reported as such: the whole check runs at once, and its findings
are the step's (what the step's reading assumes, that a kept table changed only at its end,
may not hold of a pool that is wrong; the whole check names what is wrong, or nothing). The
whole check also runs at the first step and after every `every` steps, so a change outside
any table's (a count or key changed on a block no step touched) is found within `every` steps;
`every=1` is the whole check at every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvsched.integrations.vllm.live import (
    Blocks,
    Finding,
    HashMap,
    Held,
    LiveChecker,
    PoolView,
    events_findings,
    table_counts,
)
from kvsched.spec.kv_events import DEVICE, Cleared, Entry, KvEvent, Stored

WHOLE_EVERY = 64  # steps between whole checks, by default
UNCACHED, STORED, KEPT_LAST = 0, 1, 2  # a queued block's place in the release's order


class LivePool(Blocks, Protocol):
    """A pool read in place, block by block (`PoolView` is one, read whole)."""

    @property
    def free_count(self) -> int: ...
    @property
    def cache_map(self) -> HashMap: ...
    @property
    def pinned(self) -> Mapping[int, int]: ...
    @property
    def storing(self) -> Collection[int]: ...
    @property
    def writing(self) -> Collection[int]: ...

    def ref_count(self, block: int) -> int: ...

    def key(self, block: int) -> bytes | None:
        """The key `block` carries first (None: uncached)."""
        ...

    def queue_links(self, block: int) -> tuple[int | None, int | None] | None:
        """None when `block` is not queued free; else its neighbours there (None at an end)."""
        ...

    def groups(self) -> Iterable[tuple[int, Mapping[str, Sequence[object]], Mapping[str, int]]]:
        """Each cache group: its requests' tables (the pool's own objects) and cached counts."""
        ...

    def block_of(self, entry: object) -> int:
        """The block a table entry names."""
        ...

    def held_by(self, request_id: str, group: int) -> Held:
        """One request's blocks in one group, read whole."""
        ...

    def whole(self) -> PoolView:
        """The pool read whole."""
        ...

    def published(self, key: bytes) -> Hashable:
        """A key as the pool's KV events name it."""
        ...


@dataclass(slots=True)
class _Table:
    """A request's table as last read: the pool's object, its cached count, its blocks (their
    number is the table's length then), and the step that read it."""

    source: Sequence[object]
    cached: int
    blocks: list[int]
    step: int


@dataclass(slots=True)
class DeltaChecker:
    """The checks on what each step changed, the whole pool every `every` steps; see the module."""

    every: int = WHOLE_EVERY
    checker: LiveChecker = field(default_factory=LiveChecker)
    steps: int = 0
    whole_checks: int = 0  # how many steps read the whole pool
    since_whole: int = 0
    counts: list[int] = field(default_factory=list)  # block -> its holders (tables and copies)
    keys: list[bytes | None] = field(default_factory=list)  # block -> the key it carried first
    extra: dict[int, tuple[bytes, ...]] = field(default_factory=dict)  # block -> its further keys
    zeros: int = 0  # blocks (the null block aside) nothing holds
    key_blocks: Counter[bytes] = field(default_factory=Counter)  # key -> the blocks carrying it
    tables: dict[int, dict[str, _Table]] = field(default_factory=dict)  # group -> request -> its table
    pinned: Counter[int] = field(default_factory=Counter)
    finished: set[str] = field(default_factory=set)  # finished since the last step
    published_as: dict[bytes, Hashable] = field(default_factory=dict)  # a map key -> its events' name

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"the whole pool is checked every N >= 1 steps, not {self.every}")

    def request_finished(self, request_id: str) -> None:
        self.checker.request_finished(request_id)
        self.finished.add(request_id)

    def request_added(self, request_id: str) -> None:
        self.checker.request_added(request_id)
        self.finished.discard(request_id)

    def check(self, pool: LivePool, events: Sequence[KvEvent] | None = None) -> list[Finding]:
        """Every finding at this step; `events`: what the pool published since the last step
        (None: it publishes none)."""
        self.steps += 1
        net, contradicted = _fold(self.checker.published, events or ())
        due = not self.counts or self.since_whole + 1 >= self.every or contradicted or net is None
        if due or self._off(pool, net if events is not None else None):
            return self._whole(pool, events is not None, contradicted)
        self.since_whole += 1
        return []

    # -- the whole check ------------------------------------------------------------------------

    def _whole(self, pool: LivePool, with_events: bool, contradicted: bool) -> list[Finding]:
        view = pool.whole()
        findings = self.checker.check(view)
        if with_events:
            cached: Counter[Entry] = Counter()
            known, self.published_as = self.published_as, {}  # (kept for the map's keys only)
            for key, blocks in view.cache_map.entries():
                name = known.get(key)
                if name is None:
                    name = pool.published(key)
                self.published_as[key] = name
                cached[name, DEVICE] += len(blocks)
            findings += events_findings(None if contradicted else self.checker.published, cached)
            self.checker.published = cached
        self._resync(pool, view)
        self.whole_checks += 1
        self.since_whole = 0
        return findings

    def _resync(self, pool: LivePool, view: PoolView) -> None:
        """What the next steps compare against: the pool as the whole check read it."""
        self.counts = table_counts(view)
        null = view.null_block
        self.zeros = sum(1 for block, count in enumerate(self.counts) if count == 0 and block != null)
        self.keys = list(view.keys)  # (no tuple a block: the whole check allocates little)
        self.extra = {block: tuple(keys) for block, keys in view.extra_keys.items() if keys}
        self.key_blocks = Counter(key for key in self.keys if key is not None)
        self.key_blocks.update(key for keys in self.extra.values() for key in keys)
        block_of = pool.block_of
        self.tables = {
            group: {
                request_id: _Table(
                    table, cached_of.get(request_id, 0), [block_of(entry) for entry in table], self.steps
                )
                for request_id, table in tables.items()
            }
            for group, tables, cached_of in pool.groups()
        }
        self.pinned = Counter(view.pinned)
        self.finished.clear()

    # -- what the step changed --------------------------------------------------------------------

    def _off(self, pool: LivePool, net: Counter[Entry] | None) -> bool:
        """Whether what this step changed is off anywhere (then the whole check runs)."""
        dirty: set[int] = set()
        changed = self._tables(pool, dirty)
        if changed is None or self._pins(pool, dirty):
            return True
        map_net: Counter[Entry] | None = None if net is None else Counter()
        if self._blocks(pool, dirty, map_net):
            return True
        if pool.free_count != self.zeros or pool.cache_map.distinct() != len(self.key_blocks):
            return True
        if net is not None and map_net is not None and _nonzero(net) != _nonzero(map_net):
            return True
        return self._requests(pool, changed)

    def _tables(self, pool: LivePool, dirty: set[int]) -> list[tuple[str, int, int]] | None:
        """Each table's change into the holders and `dirty`; the requests whose table or cached
        count changed, each with the first block to verify (None: a finished one holds blocks)."""
        step, block_of, null = self.steps, pool.block_of, pool.null_block
        changed: list[tuple[str, int, int]] = []
        for group, tables, cached_of in pool.groups():
            known_tables = self.tables.setdefault(group, {})
            for request_id, table in tables.items():
                known, cached = known_tables.get(request_id), cached_of.get(request_id, 0)
                if known is not None and table is known.source:
                    length = len(known.blocks)
                    if len(table) == length and cached == known.cached:
                        known.step = step
                        continue
                    if len(table) >= length and cached >= known.cached:  # grown at its end
                        if length and block_of(table[length - 1]) != known.blocks[-1]:
                            return None
                        new = [block_of(entry) for entry in table[length:]]
                        self._hold(new, 1, null, dirty)
                        known.blocks += new
                        dirty.update(known.blocks[known.cached : cached])  # cached since: their keys
                        changed.append((request_id, group, known.cached))
                        known.cached, known.step = cached, step
                        continue
                if known is not None:
                    self._hold(known.blocks, -1, null, dirty)
                blocks = [block_of(entry) for entry in table]
                self._hold(blocks, 1, null, dirty)
                known_tables[request_id] = _Table(table, cached, blocks, step)
                changed.append((request_id, group, 0))
            if len(tables) != len(known_tables):  # tables gone: their requests finished or were preempted
                for request_id in [request_id for request_id, known in known_tables.items() if known.step != step]:
                    self._hold(known_tables.pop(request_id).blocks, -1, null, dirty)
        for request_id in self.finished:
            if any((known := tables.get(request_id)) is not None and known.blocks for tables in self.tables.values()):
                return None
        self.finished.clear()
        return changed

    def _hold(self, blocks: Iterable[int], by: int, null: int, dirty: set[int]) -> None:
        counts = self.counts
        for block in blocks:
            if block == null:
                continue
            if not 0 <= block < len(counts):
                raise IndexError(f"block {block} is outside the pool's {len(counts)}")
            before = counts[block]
            counts[block] = before + by
            self.zeros += (before + by == 0) - (before == 0)
            dirty.add(block)

    def _pins(self, pool: LivePool, dirty: set[int]) -> bool:
        """The copies' references into the holders and `dirty`; the stores seen (their blocks
        may go to the queue's front); whether a block a copy writes carries a key."""
        if pool.pinned or self.pinned:
            pinned = Counter(pool.pinned)
            for block in pinned.keys() | self.pinned.keys():
                by = pinned[block] - self.pinned[block]
                if by:
                    self._hold((block,) * abs(by), 1 if by > 0 else -1, pool.null_block, dirty)
            self.pinned = pinned
        dirty.update(pool.storing)
        dirty.update(pool.writing)
        stored, counts, pins = self.checker.stored, self.counts, self.pinned
        for block in pool.storing:
            key = pool.key(block)
            if key is not None and counts[block] <= pins[block]:
                stored[block] = key
        for block in [block for block, key in stored.items() if pool.key(block) != key or counts[block] > pins[block]]:
            del stored[block]
        return any(pool.carried(block) for block in pool.writing)

    def _blocks(self, pool: LivePool, dirty: set[int], map_net: Counter[Entry] | None) -> bool:
        """Every block the step touched against its holders, the queue and the map; its keys'
        change into `map_net` (when the pool publishes events). Whether one is off."""
        counts, keys, extra, key_blocks, null = self.counts, self.keys, self.extra, self.key_blocks, pool.null_block
        holds, published = pool.cache_map.holds, self._published(pool)
        for block in dirty:
            if block == null:
                continue
            count = counts[block]
            if pool.ref_count(block) != count:
                return True
            links = pool.queue_links(block)
            if (links is None) != (count > 0):
                return True
            carried, first = pool.carried(block), keys[block]
            old = extra.get(block, ()) if first is None else (first, *extra.get(block, ()))
            if carried != old:
                for key in old:
                    if key not in carried:
                        key_blocks[key] -= 1
                        if not key_blocks[key]:
                            del key_blocks[key]
                        if holds(key, block):
                            return True
                        if map_net is not None:
                            map_net[published(key), DEVICE] -= 1
                for key in carried:
                    if key not in old:
                        key_blocks[key] += 1
                        if not holds(key, block):
                            return True
                        if map_net is not None:
                            map_net[published(key), DEVICE] += 1
                keys[block] = pool.key(block)
                if len(carried) > (keys[block] is not None):
                    extra[block] = carried[1:] if keys[block] is not None else carried
                else:
                    extra.pop(block, None)
            if links is not None and self._misordered(pool, block, links):
                return True
        return False

    def _published(self, pool: LivePool) -> Callable[[bytes], Hashable]:
        """A key as the pool's events name it, each named once."""
        known = self.published_as

        def published(key: bytes) -> Hashable:
            name = known.get(key)
            if name is None:
                name = known[key] = pool.published(key)
            return name

        return published

    def _place(self, pool: LivePool, block: int) -> int:
        key = pool.key(block)
        if key is None:
            return UNCACHED
        return STORED if self.checker.stored.get(block) == key else KEPT_LAST

    def _misordered(self, pool: LivePool, block: int, links: tuple[int | None, int | None]) -> bool:
        """The release's order around a queued block: no uncached block behind a cached one
        kept last (a block a store read may sit anywhere: its neighbours are looked past)."""
        place = self._place(pool, block)
        if place == STORED:
            return False
        side = 1 if place == KEPT_LAST else 0  # a kept-last block looks behind it, an uncached one ahead
        other = links[side]
        while other is not None and self._place(pool, other) == STORED:
            next_links = pool.queue_links(other)
            other = None if next_links is None else next_links[side]
        if other is None:
            return False
        return self._place(pool, other) == (UNCACHED if place == KEPT_LAST else KEPT_LAST)

    def _requests(self, pool: LivePool, changed: list[tuple[str, int, int]]) -> bool:
        """Each request whose table or cached count changed: the blocks it cached since carry
        their tokens' key as first seen, the blocks past them no key but their own."""
        checker = self.checker
        for request_id, group, start in changed:
            held = pool.held_by(request_id, group)
            if _stale(pool, held):
                return True
            cached = min(held.cached, len(held.blocks), len(held.keys))
            if any(checker.block_content(pool, held, index) for index in range(start, cached)):
                return True
            checker.verified[request_id, group] = tuple(held.blocks[:cached])
        return False


def _nonzero(counts: Counter[Entry]) -> dict[Entry, int]:
    """The entries a net change moved (up or down)."""
    return {entry: by for entry, by in counts.items() if by}


def _stale(pool: Blocks, held: Held) -> bool:
    for index in range(held.cached, len(held.blocks)):
        block = held.blocks[index]
        carried = pool.carried(block) if block != pool.null_block else ()
        if carried and carried != ((held.keys[index],) if index < len(held.keys) else ()):
            return True
    return False


def _fold(published: Counter[Entry], events: Iterable[KvEvent]) -> tuple[Counter[Entry] | None, bool]:
    """`events` folded into `published` in place (one block a `Stored`, one a `Removed`); their
    net change per entry (None after a `Cleared`: the whole check compares), and whether one
    removed a block no event stored (it is skipped)."""
    net: Counter[Entry] | None = Counter()
    contradicted = False
    for event in events:
        if isinstance(event, Cleared):
            published.clear()
            net = None
            continue
        entry = (event.key, event.tier)
        if isinstance(event, Stored):
            published[entry] += 1
            by = 1
        elif published[entry] > 0:
            published[entry] -= 1
            if not published[entry]:
                del published[entry]
            by = -1
        else:
            del published[entry]
            contradicted = True
            continue
        if net is not None:
            net[entry] += by
    return net, contradicted
