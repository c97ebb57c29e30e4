"""KV events: what an engine tells a router about the pages it has cached.

An engine's cached set is the pairs (key, tier) it could serve a prefix hit from: each key of
its automatic prefix cache on the device (`DEVICE`) and of its host tier's cache (`HOST`). It
publishes how that set changes as batches of events:

    Stored(key, parent, tokens, tier)   key is cached on tier now; parent is the key of the page
                                        before it in its chain (None for a chain's first page),
                                        tokens how many tokens the page holds
    Removed(key, tier)                  key is no longer cached on tier
    Cleared()                           nothing is cached on any tier (a reset)

A batch (`EventBatch`) names its engine, the engine's restart epoch and a sequence number:
0 for an epoch's first batch, one more for each next, never repeated within an epoch. Folding
an engine's batches in order into the empty set gives exactly its cached set after the last
one (`fold_events`); a `Snapshot` is that set as of the batches before one (`next_seq`, 0 before
the first), for a consumer that missed some to start again from.

A batch here maps one to one onto vLLM's `KVEventBatch` (`to_vllm`): `Stored` is a
`BlockStored` of one block hash, `Removed` a `BlockRemoved`, `Cleared` an `AllBlocksCleared`,
the tier its `medium`; vLLM's stream carries the sequence number beside the batch (its ZMQ
frame) and has no epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvsched.spec import refusals

Key = Hashable
DEVICE, HOST = "GPU", "CPU"  # vLLM's media
TIER_NAMES = (DEVICE, HOST)
Entry = tuple[Key, str]  # (key, tier)


@dataclass(frozen=True, slots=True)
class Stored:
    """`key` is cached on `tier` now; `parent` is the key before it in its chain."""

    key: Key
    parent: Key | None
    tokens: int
    tier: str = DEVICE


@dataclass(frozen=True, slots=True)
class Removed:
    """`key` is no longer cached on `tier`."""

    key: Key
    tier: str = DEVICE


@dataclass(frozen=True, slots=True)
class Cleared:
    """Nothing is cached on any tier."""


KvEvent = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One engine's events, in order: its `seq`-th batch of restart epoch `epoch`."""

    engine: str
    epoch: int
    seq: int
    events: tuple[KvEvent, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An engine's cached set in `epoch` once its batches before `next_seq` are folded (every key
    with its parent): the batch a consumer folds after it is `next_seq`."""

    engine: str
    epoch: int
    next_seq: int
    cached: tuple[tuple[Key, str, Key | None], ...]  # (key, tier, parent), in canonical order

    def entries(self) -> frozenset[Entry]:
        """The cached set."""
        return frozenset((key, tier) for key, tier, _ in self.cached)


# -- well-formed input -----------------------------------------------------------------------------


def require_batch(batch: object) -> EventBatch:
    """`batch` if it is a well-formed batch; `InvalidArgument` naming what is wrong if not."""
    if not isinstance(batch, EventBatch):
        raise refusals.wrong_kind("batch", "EventBatch", batch)
    _require_origin(batch.engine, batch.epoch, batch.seq)
    if not isinstance(batch.events, tuple):
        raise refusals.malformed_events(f"events must be a tuple, not {type(batch.events).__name__}")
    for event in batch.events:
        if isinstance(event, Stored):
            if not isinstance(event.tokens, int) or isinstance(event.tokens, bool) or event.tokens < 1:
                raise refusals.malformed_events(f"{event!r} holds {event.tokens!r} tokens, not a positive int")
            _require_entry(event.key, event.tier)
            if event.parent is not None:
                _require_key(event.parent)
        elif isinstance(event, Removed):
            _require_entry(event.key, event.tier)
        elif not isinstance(event, Cleared):
            raise refusals.malformed_events(f"{event!r} is not a KV event")
    return batch


def require_snapshot(snapshot: object) -> Snapshot:
    """`snapshot` if it is well formed (each key once per tier); `InvalidArgument` if not."""
    if not isinstance(snapshot, Snapshot):
        raise refusals.wrong_kind("snapshot", "Snapshot", snapshot)
    _require_origin(snapshot.engine, snapshot.epoch, snapshot.next_seq)
    if not isinstance(snapshot.cached, tuple):
        raise refusals.malformed_events(f"a snapshot's cached must be a tuple, not {type(snapshot.cached).__name__}")
    seen: set[Entry] = set()
    for item in snapshot.cached:
        if not isinstance(item, tuple) or len(item) != 3:
            raise refusals.malformed_events(f"{item!r} is not a (key, tier, parent) triple")
        key, tier, parent = item
        _require_entry(key, tier)
        if parent is not None:
            _require_key(parent)
        if (key, tier) in seen:
            raise refusals.malformed_events(f"the snapshot names {key!r} on {tier} twice")
        seen.add((key, tier))
    return snapshot


def _require_origin(engine: object, epoch: object, seq: object) -> None:
    if not isinstance(engine, str) or not engine:
        raise refusals.malformed_events(f"an engine is named by a non-empty str, not {engine!r}")
    for name, value in (("epoch", epoch), ("seq", seq)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise refusals.malformed_events(f"{name} must be an int >= 0, not {value!r}")


def _require_key(key: object) -> None:
    try:
        hash(key)
    except TypeError:
        raise refusals.malformed_events(f"{key!r} is not a key") from None
    if key is None:
        raise refusals.malformed_events("None is not a key")


def _require_entry(key: object, tier: object) -> None:
    _require_key(key)
    if tier not in TIER_NAMES:
        raise refusals.malformed_events(f"{tier!r} is not a tier (one of {TIER_NAMES})")


# -- folding ---------------------------------------------------------------------------------------


def fold_events(cached: frozenset[Entry], events: Iterable[KvEvent]) -> frozenset[Entry] | None:
    """`cached` after `events`, in order; None when one contradicts it (a key stored on a tier
    it is cached on already, or removed from one it is not on)."""
    entries = set(cached)
    for event in events:
        if isinstance(event, Cleared):
            entries.clear()
        elif isinstance(event, Stored):
            if (event.key, event.tier) in entries:
                return None
            entries.add((event.key, event.tier))
        else:
            if (event.key, event.tier) not in entries:
                return None
            entries.discard((event.key, event.tier))
    return frozenset(entries)


def fold_counted(counts: Counter[Entry], events: Iterable[KvEvent]) -> Counter[Entry] | None:
    """`counts` after `events` for a manager that may cache one key on several pages (vLLM does
    not de-duplicate its blocks): each `Stored` one page more under its key, each `Removed` one
    page fewer; None when a removal finds no page."""
    counted = Counter(counts)
    for event in events:
        if isinstance(event, Cleared):
            counted.clear()
        elif isinstance(event, Stored):
            counted[event.key, event.tier] += 1
        elif counted[event.key, event.tier] == 0:
            return None
        else:
            counted[event.key, event.tier] -= 1
    return +counted


def changes(
    published: frozenset[Entry], cached: Mapping[Entry, tuple[Key | None, int]], tokens: int, cleared: bool = False
) -> tuple[KvEvent, ...]:
    """The events that take a consumer from `published` to `cached` (each entry with its parent
    and chain depth): `Cleared` first if the engine was reset since (`cleared`), then each entry
    gone removed, then each new one stored, a tier's shallower pages before its deeper ones."""
    before = frozenset() if cleared else published
    gone = sorted(before - cached.keys(), key=_order)
    new = sorted(cached.keys() - before, key=lambda entry: (cached[entry][1], *_order(entry)))
    return (
        *((Cleared(),) if cleared else ()),
        *(Removed(key, tier) for key, tier in gone),
        *(Stored(key, cached[key, tier][0], tokens, tier) for key, tier in new),
    )


def _order(entry: Entry) -> tuple[int, str]:
    key, tier = entry
    return TIER_NAMES.index(tier), repr(key)


# -- vLLM's encoding -------------------------------------------------------------------------------


def to_vllm(batch: EventBatch, block_size: int) -> tuple[int, list[Any]]:
    """`batch` as vLLM's ZMQ stream carries it: its sequence number and its `KVEventBatch`'s
    events, each as msgspec encodes vLLM's tagged, array-like structs (a list led by its tag:
    `BlockStored` block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
    lora_name; `BlockRemoved` block_hashes, medium; `AllBlocksCleared`). kvsched's events carry
    no token ids: `token_ids` is empty and `block_size` says how many a block holds."""
    events: list[Any] = []
    for event in batch.events:
        if isinstance(event, Stored):
            events.append(["BlockStored", [event.key], event.parent, [], block_size, None, event.tier, None])
        elif isinstance(event, Removed):
            events.append(["BlockRemoved", [event.key], event.tier])
        else:
            events.append(["AllBlocksCleared"])
    return batch.seq, events


def from_vllm(engine: str, epoch: int, seq: int, events: list[Any]) -> EventBatch:
    """vLLM's events (as `to_vllm` writes them, or msgspec decodes a stream's) as a batch: a
    `BlockStored` or `BlockRemoved` of several hashes is one event per hash, in order, each stored
    block's parent the hash before it."""
    out: list[KvEvent] = []
    for event in events:
        tag = event[0] if isinstance(event, list | tuple) and event else None
        if tag in ("BlockStored", "BlockRemoved") and (len(event) < 3 or not isinstance(event[1], list | tuple)):
            raise refusals.malformed_events(f"{event!r} names no list of block hashes")
        if tag == "BlockStored" and len(event) >= 7:
            parent = event[2]
            for key in event[1]:
                out.append(Stored(key, parent, event[4], event[6] or DEVICE))
                parent = key
        elif tag == "BlockRemoved" and len(event) >= 3:
            out.extend(Removed(key, event[2] or DEVICE) for key in event[1])
        elif tag == "AllBlocksCleared":
            out.append(Cleared())
        else:
            raise refusals.malformed_events(f"{event!r} is not one of vLLM's KV events")
    return require_batch(EventBatch(engine, epoch, seq, tuple(out)))
