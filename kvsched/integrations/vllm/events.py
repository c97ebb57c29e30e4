"""vLLM's KV events as kvsched's (`kvsched.spec.kv_events`): no vLLM import needed here.

`translate` reads vLLM's `BlockStored`, `BlockRemoved` and `AllBlocksCleared` (by their class
names, so any release's) as one event a block hash, each named by `key(hash, group)`: the view's
key for `kvsched check`'s adapters, the published form for the live checker. A stored block's
parent is the hash before it; a medium other than the GPU is the host tier. `EventWatch` reads a
pool's `kv_event_queue` in place, what was appended since it last looked, including what the
scheduler took in between (`take_events` hands over the list and starts another; vLLM's scheduler
takes once per step, so at most once between two of the checker's looks).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from kvsched.spec.kv_events import DEVICE, HOST, Cleared, KvEvent, Removed, Stored

KeyOf = Callable[[Any, int], Hashable]


def translate(events: Iterable[Any], key: KeyOf) -> list[KvEvent]:
    """vLLM's `events` as kvsched's, each block hash named `key(hash, group)`."""
    out: list[KvEvent] = []
    for event in events:
        kind = type(event).__name__
        group = getattr(event, "group_idx", None) or 0
        tier = DEVICE if getattr(event, "medium", None) in (None, "GPU") else HOST
        if kind == "BlockStored":
            parent = None if event.parent_block_hash is None else key(event.parent_block_hash, group)
            for block_hash in event.block_hashes:
                named = key(block_hash, group)
                out.append(Stored(named, parent, event.block_size, tier))
                parent = named
        elif kind == "BlockRemoved":
            out.extend(Removed(key(block_hash, group), tier) for block_hash in event.block_hashes)
        elif kind == "AllBlocksCleared":
            out.append(Cleared())
        else:
            raise TypeError(f"{kind} is not one of vLLM's KV events")
    return out


class EventWatch:
    """What a pool appended to its `kv_event_queue` since the watch last looked."""

    def __init__(self) -> None:
        self.queue: list[Any] | None = None
        self.seen = 0

    def new(self, pool: Any) -> list[Any]:
        """The events `pool` published since the last call (the whole queue at the first)."""
        queue: list[Any] = pool.kv_event_queue
        fresh: list[Any] = []
        if self.queue is not None and queue is not self.queue:  # taken since: the rest of the old list
            fresh += self.queue[self.seen :]
            self.seen = 0
        fresh += queue[self.seen :]
        self.queue, self.seen = queue, len(queue)
        return fresh
