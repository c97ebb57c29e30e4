"""vLLM's `BlockPool` with vLLM's CPU offloading manager as its host tier, behind the adapter
protocol (capabilities "demote" and "promote"; vLLM 0.32.0 to 0.34.0, in the venvs `make vllm`
builds), with two-phase admission (capabilities "lookup" and "commit").

The device side is `kvsched.testing.adapters.vllm.VllmPool`: the pool driven as vLLM's
full-attention manager drives it. The host tier is vLLM's own `CPUOffloadingManager`
(`vllm.v1.kv_offload.cpu.manager`, LRU policy), one chunk per host page, called the way vLLM's
offloading connector calls it (`OffloadingConnectorScheduler`), with the copies completing
within the call (the harness makes them):

- demote: each cached block only the pool's cache holds, in the order the pool would evict
  them, whose key the host lacks (`lookup` misses), is offered alone to `prepare_store`; the
  chunk it names is the copy's destination, and `complete_store` makes it loadable. A refused
  store (the host's chunks all pinned) ends the demotion.
- admit: the device run of `get_cached_block` hits, then the host run after it (`lookup` hits,
  as `get_num_new_matched_tokens` counts them), both capped before the prompt's last token;
  once the pool has the blocks, `prepare_load` pins the host run's chunks and names them (as
  `update_state_after_alloc` does), each is copied into the request's fresh block in its
  position, and `complete_load` unpins them. A refusal (too few free blocks) happens before
  any of it: nothing changes.
- lookup and commit: a lookup counts the device and host runs and names the device blocks; its
  commit, with other calls between, keeps the device blocks that are still the ones the pool
  caches under their hashes (an evicted or reused block ends the run), asks the host again from
  there, no further than the lookup reached, and admits as above.
- free: `on_request_finished`; reset_cache: the pool's `reset_prefix_cache` alone, as vLLM's
  scheduler resets by default (`reset_connector=False`): the host tier keeps its chunks
  (`offloaded_events` resets both, as `reset_connector=True` does).
- events (`offloaded_events`, `offloaded_events_device_reset`): the pool's KV events and the host
  tier's (`enable_events`, `take_events`), its keys on the host tier. A device reset publishes
  vLLM's `AllBlocksCleared`, which names no medium: folded, it empties the host tier as well, so
  with the default reset, whose host tier keeps its chunks, the events no longer fold to what
  is cached (`offloaded_events_device_reset` fails by its events).
- lease: a connector's save of a request's blocks, as vLLM's offloading connector stores a
  request's computed blocks and vLLM's scheduler holds a finished request's blocks until the
  store is done: the pool's `touch` takes one more reference on each, and the cached blocks
  whose keys the host lacks go to `prepare_store`; end_lease completes the store
  (`complete_store`), gives the blocks back with `free_blocks`, and returns the copies. The
  view's `leased` counts the blocks, its holders are the counts less the leases, and its
  `host_pending` the chunks a save has still to write (not ready).

Keys: a host chunk's `OffloadKey` is its block's hash with its group index (0), the same bytes as
the device block's `BlockHashWithGroupId`, so the view's `host` and `cached` compare directly.
The view's `host` is the chunks `lookup` would serve (ready); `host_free` the chunks the manager
would hand out next (its free list and the chunks it has never allocated).

Broken variants of the host tier (each an upstream bug's shape) are in
`devtools/vllm/offload_teeth.py`.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvsched.spec.kv_events import HOST, KvEvent, Removed, Stored
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters.vllm import VllmPool, pool_view

OFFLOAD_GROUP = 0  # the one KV-cache group the harness's pool has


@dataclass(frozen=True)
class Match:
    """A prompt's cached run as found: the pool's blocks, then the host tier's keys after them."""

    hits: list[Any]
    loads: list[Any]


@dataclass(frozen=True)
class Save:
    """A connector's save, while its lease lasts: the blocks it holds, its offloading context, the
    keys `prepare_store` took and the (block, chunk) copies they name."""

    blocks: list[Any]
    context: Any
    keys: list[Any]
    pairs: list[tuple[int, int]]


@dataclass(frozen=True)
class Found:
    """A lookup's answer, kept by the harness until the commit: the device blocks found, by id,
    and how many host chunks followed them."""

    blocks: tuple[int, ...]
    host: int


class _Offload:
    """vLLM's offloading modules, imported once (vLLM is optional), their names checked first
    (`kvsched.integrations.vllm.names.OFFLOAD_TABLE`)."""

    def __init__(self) -> None:
        from kvsched.integrations.vllm.names import require_offload_names

        require_offload_names()  # each name used here is where this release has it, or UnsupportedVllm
        self.base: Any = importlib.import_module("vllm.v1.kv_offload.base")
        self.cpu: Any = importlib.import_module("vllm.v1.kv_offload.cpu.manager")


@functools.cache
def _offload() -> _Offload:
    """The modules, imported on first use (vLLM is optional)."""
    return _Offload()


class VllmOffloaded(VllmPool):
    """vLLM's `BlockPool` over `pages` blocks and vLLM's `CPUOffloadingManager` over `host_pages`
    chunks; see the module docstring."""

    capabilities = frozenset({"atomic", "reset_cache", "demote", "promote", "lease", "end_lease", "lookup", "commit"})

    def __init__(
        self,
        pages: int,
        page_size: int,
        host_pages: int | None = None,
        host_class: Any = None,
        *,
        events: bool = False,
        reset_connector: bool = False,
    ) -> None:
        super().__init__(pages, page_size)
        if events:
            self.capabilities = type(self).capabilities | {"events"}
        self.reset_connector = reset_connector
        self.offload = _offload()
        self.host_pages = pages if host_pages is None else host_pages
        self.host = (host_class or self.offload.cpu.CPUOffloadingManager)(
            self.host_pages, cache_policy="lru", enable_events=True
        )
        self.contexts: dict[int, Any] = {}  # each live request's offloading context
        self._promoted: dict[int, list[tuple[int, int]]] = {}  # the last admission's (host page, page) copies
        self._stores = 0  # demotions so far: each store has its own context
        self.probe = self.offload.base.ReqContext(req_id="lookup")  # a lookup's context (lookups read none)
        self.leases: dict[int, Save] = {}  # a save's lease -> what it holds and stores
        self._next_lease = 0

    def _context(self, name: str) -> Any:
        context = self.offload.base.ReqContext(req_id=name)
        self.host.on_new_request(context)
        return context

    def _key(self, block_hash: bytes) -> Any:
        return self.offload.base.make_offload_key(block_hash, OFFLOAD_GROUP)

    def _match(self, request: Any, tokens: int, device: int | None = None, total: int | None = None) -> Match:
        """The prompt's cached run: device blocks (at most `device`), then the host chunks' keys
        after them, `total` pages at most, both capped before the prompt's last token."""
        limit = (tokens - 1) // self.page_size if total is None else min(total, (tokens - 1) // self.page_size)
        hits = []
        for block_hash in request.block_hashes[: limit if device is None else min(device, limit)]:
            found = self.pool.get_cached_block(block_hash, [OFFLOAD_GROUP])
            if found is None:
                break
            hits.append(found[0])
        hit = self.offload.base.LookupResult.HIT
        loads = []
        for block_hash in request.block_hashes[len(hits) : limit]:
            key = self._key(block_hash)
            if self.host.lookup(key, self.probe) is not hit:
                break
            loads.append(key)
        return Match(hits, loads)

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        request = self.vllm.request_for(request_id, tokens, self.page_size)
        return self._admit(request_id, request, len(tokens), self._match(request, len(tokens)))

    def lookup(self, request_id: int, tokens: Sequence[int]) -> Found:
        """What the pool and the host tier hold for the prompt now (as the scheduler's
        `get_computed_blocks` and the connector's `get_num_new_matched_tokens` count it)."""
        request = self.vllm.request_for(request_id, tokens, self.page_size)
        match = self._match(request, len(tokens))
        return Found(tuple(block.block_id for block in match.hits), len(match.loads))

    def commit(self, request_id: int, tokens: Sequence[int], found: Found) -> int | None:
        """Admit with what the lookup found, as far as it still holds: a device block must still
        be the one the pool caches under its hash (one evicted, or reused, since ends the run),
        and the host run is asked again from there, no further than the lookup reached."""
        request = self.vllm.request_for(request_id, tokens, self.page_size)
        now = self._match(request, len(tokens), total=len(found.blocks))
        kept = 0
        for block, block_id in zip(now.hits, found.blocks, strict=False):
            if block.block_id != block_id:
                break
            kept += 1
        match = self._match(request, len(tokens), device=kept, total=len(found.blocks) + found.host)
        return self._admit(request_id, request, len(tokens), match)

    def _admit(self, request_id: int, request: Any, tokens: int, match: Match) -> int | None:
        hits, loads = match.hits, match.loads
        fresh = -(-tokens // self.page_size) - len(hits)
        if fresh > self.pool.get_num_free_blocks() - sum(block.ref_cnt == 0 for block in hits):
            return None
        context = self._context(str(request_id))
        self.pool.touch(hits)
        blocks = self.pool.get_new_blocks(fresh)
        self.requests[request_id] = (request, hits + blocks)
        self.cached[request_id] = len(hits)
        self.contexts[request_id] = context
        pairs = []
        if loads:
            chunks = self.host.prepare_load(loads, context).block_ids
            pairs = [(int(chunk), block.block_id) for chunk, block in zip(chunks, blocks[: len(loads)], strict=True)]
            self.host.complete_load(loads, context)
        self._promoted[request_id] = pairs
        return (len(hits) + len(loads)) * self.page_size

    def promote(self, request_id: int) -> list[tuple[int, int]]:
        return self._promoted.get(request_id, [])

    def demote(self) -> list[tuple[int, int]]:
        """Offer each block only the cache holds, in eviction order, to the host tier."""
        pairs = []
        miss = self.offload.base.LookupResult.MISS
        for block in self.pool.free_block_queue.get_all_free_blocks():
            if block.block_hash is None:
                continue
            key = self.offload.base.OffloadKey(bytes(block.block_hash))
            if self.host.lookup(key, self.probe) is not miss:
                continue
            self._stores += 1
            context = self._context(f"store-{self._stores}")
            stored = self.host.prepare_store([key], context)
            if stored is None:
                break
            chunks = stored.store_spec.block_ids
            self.host.complete_store(stored.keys_to_store, context)
            self.host.on_request_finished(context)
            pairs += [(block.block_id, int(chunk)) for chunk in chunks]
        return pairs

    def lease(self, request_id: int) -> int:
        """A connector's save of the request's blocks: the pool's `touch` holds them all, and its
        cached blocks whose keys the host lacks go to `prepare_store` (their chunks are written
        while the lease lasts)."""
        _, blocks = self.requests[request_id]
        self.pool.touch(list(blocks))
        self._next_lease += 1
        context = self._context(f"save-{self._next_lease}")
        miss = self.offload.base.LookupResult.MISS
        offered: dict[Any, Any] = {}  # key -> the block it is the hash of, in the request's order
        for block in blocks:
            if block.block_hash is not None:
                key = self.offload.base.OffloadKey(bytes(block.block_hash))
                if self.host.lookup(key, self.probe) is miss:
                    offered.setdefault(key, block)
        keys, pairs = [], []
        stored = self.host.prepare_store(list(offered), context) if offered else None
        if stored is not None:
            keys = list(stored.keys_to_store)
            chunks = stored.store_spec.block_ids
            pairs = [(offered[key].block_id, int(chunk)) for key, chunk in zip(keys, chunks, strict=True)]
        self.leases[self._next_lease] = Save(list(blocks), context, keys, pairs)
        return self._next_lease

    def end_lease(self, lease: int) -> list[tuple[int, int]]:
        """The save's copies are done: `complete_store` makes their chunks loadable, and the pool
        gets its blocks back (`free_blocks`); the (block, chunk) copies made."""
        save = self.leases.pop(lease)
        if save.keys:
            self.host.complete_store(save.keys, save.context)
        self.host.on_request_finished(save.context)
        self.pool.free_blocks(reversed(save.blocks))
        return save.pairs

    def free(self, request_id: int) -> None:
        super().free(request_id)
        self._promoted.pop(request_id, None)
        self.host.on_request_finished(self.contexts.pop(request_id))

    def reset_cache(self) -> bool:
        """The pool's `reset_prefix_cache`; with `reset_connector`, once it succeeds, the host
        tier's `reset_cache` too (the scheduler's `reset_prefix_cache(reset_connector=True)`)."""
        reset = super().reset_cache()
        if reset and self.reset_connector:
            self.host.reset_cache()
        return reset

    def events(self) -> list[KvEvent]:
        """The pool's KV events, then the host tier's (`take_events`: one `OffloadingEvent` a
        batch of keys stored or removed, each key as the view's host names it)."""
        host: list[KvEvent] = []
        for event in self.host.take_events():
            for key in event.keys:
                host.append(
                    Removed(bytes(key), HOST) if event.removed else Stored(bytes(key), None, self.page_size, HOST)
                )
        return [*super().events(), *host]

    def view(self) -> PoolView:
        tables = {rid: tuple(block.block_id for block in blocks) for rid, (_, blocks) in self.requests.items()}
        host = self.host
        chunks = host._policy.chunks.items()
        never_allocated = range(host._num_allocated_chunks, host._num_chunks)
        view = pool_view(self.pool, tables)
        leased = Counter(block.block_id for save in self.leases.values() for block in save.blocks)
        holders = tuple(count - leased[page] for page, count in enumerate(view.holders))
        return replace(
            view,
            holders=holders,
            leased=dict(leased),
            host={int(chunk.chunk_id): bytes(key) for key, chunk in chunks if chunk.is_ready},
            host_free=frozenset(host._free_list) | frozenset(never_allocated),
            host_pending=frozenset(int(chunk.chunk_id) for _, chunk in chunks if not chunk.is_ready),
            host_pages=self.host_pages,
        )


def offloaded(pages: int, page_size: int) -> VllmOffloaded:
    """vLLM's `BlockPool` with vLLM's `CPUOffloadingManager` as its host tier (as many chunks as
    blocks), as installed."""
    return VllmOffloaded(pages, page_size)


def offloaded_events(pages: int, page_size: int) -> VllmOffloaded:
    """`offloaded` publishing both tiers' KV events, a reset resetting both tiers."""
    return VllmOffloaded(pages, page_size, events=True, reset_connector=True)


def offloaded_events_device_reset(pages: int, page_size: int) -> VllmOffloaded:
    """`offloaded` publishing both tiers' KV events, a reset resetting the device alone (vLLM's
    default): its `AllBlocksCleared` drops the host tier's keys from the stream, not from the
    tier (fails by its events)."""
    return VllmOffloaded(pages, page_size, events=True)
