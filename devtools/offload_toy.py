"""A third-party block manager in vLLM v1's shape with a host offload tier, its adapter, and five
planted bugs `kvsched check` must find at its defaults (`devtools.check_defaults`).

Blocks carry reference counts; freed blocks go to the back of a free queue and keep their hash
until the queue hands them out again (then their cache entry goes). A block's hash chains its
parent's, its tokens and the request's tenant (vLLM's `cache_salt`). Fork shares a parent's blocks;
a write into a shared block copies it first. A lease (a connector reading a request's blocks)
holds a reference on each. The host tier keeps offloaded blocks under their hashes, least
recently stored first; `offload` stores the blocks the free queue hands out next, and an
admission loads the blocks that continue its device hit from the host.

`fault`:
- "cow_above_2": copy-on-write only when a block's count is above 2;
- "unsalted": the block hash leaves the tenant out;
- "host_keeps_old_key": a full host tier reuses its oldest block but its index still maps the
  old hash to it;
- "free_drops_leases": `free` also drops the leases' holds on the request's blocks;
- "loaded_unkeyed": a block loaded from the host enters the hash map but is never given its
  hash, so when the free queue hands it out again the map keeps a stale entry.

Asynchronous (`asynchronous=True`, capability "async_copies"): offloads and loads are copies in
flight until the engine completes them. A copy holds its block (a reference of its own) and a load
its host block; a store registers its hash when it completes, a failed one frees its host block;
a load caches its block when it completes, and a failed one leaves the request computed only up to
the block it should have filled. Its planted bugs:
- "store_unpinned": a block under a store in flight stays in the free queue;
- "failed_store_keyed": a failed store still registers its hash on the host block;
- "failed_load_cached": a failed load's block is cached anyway, and the request's claim stands
  (Dynamo #15079's shape);
- "freed_under_load": a load takes no hold of its block, so a request freed mid-load frees it.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence

from kvsched.testing import PoolView
from kvsched.testing.adapter import tenant_of

FAULTS = ("cow_above_2", "unsalted", "host_keeps_old_key", "free_drops_leases", "loaded_unkeyed")
ASYNC_FAULTS = ("store_unpinned", "failed_store_keyed", "failed_load_cached", "freed_under_load")


class OffloadBlockManager:
    """Reference-counted blocks, a hashed prefix cache, leases and a host tier of `host_blocks`."""

    def __init__(
        self, num_blocks: int, block_size: int, host_blocks: int, fault: str = "", asynchronous: bool = False
    ) -> None:
        self.block_size, self.fault, self.asynchronous = block_size, fault, asynchronous
        self.in_flight: dict[int, tuple[int, int, bool]] = {}  # copy -> (block, host block, to the host)
        self.copy_keys: dict[int, str] = {}  # copy -> the hash it carries
        self.pins = [0] * num_blocks  # each block's references held by copies in flight
        self.host_pins: dict[int, int] = {}  # host block -> loads reading it
        self.host_pending: set[int] = set()  # host blocks a store still writes
        self.computed: dict[int, int] = {}  # request -> the tokens it is told are computed
        self._next_copy = 0
        self.ref_cnt = [0] * num_blocks
        self.free_queue: deque[int] = deque(range(num_blocks))
        self.block_hash: dict[int, str] = {}  # block -> the hash it is cached under
        self.cached: dict[str, int] = {}  # hash -> block
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.salts: dict[int, int] = {}
        self.hashed: dict[int, int] = {}  # request -> its blocks cached so far
        self.leases: dict[int, list[int]] = {}
        self.host_key: dict[int, str] = {}  # host block -> the hash it holds
        self.host_index: dict[str, int] = {}  # hash -> host block
        self.host_free = list(range(host_blocks))
        self.host_order: deque[int] = deque()  # keyed host blocks, oldest first
        self.loads: dict[int, list[tuple[int, int]]] = {}  # request -> its last (host block, block) loads
        self.last_copy: tuple[int, int] | None = None
        self._next_lease = 0

    def hash_of(self, parent: str, tokens: Sequence[int], salt: int) -> str:
        extra = () if self.fault == "unsalted" else (salt,)
        return hashlib.sha256(repr((parent, tuple(tokens), extra)).encode()).hexdigest()[:16]

    def hashes(self, tokens: Sequence[int], salt: int, blocks: int) -> list[str]:
        out, parent = [], ""
        for index in range(blocks):
            parent = self.hash_of(parent, tokens[index * self.block_size : (index + 1) * self.block_size], salt)
            out.append(parent)
        return out

    def _pop_free(self) -> int:
        block = self.free_queue.popleft()
        old = self.block_hash.pop(block, None)
        if old is not None:
            del self.cached[old]
        self.ref_cnt[block] = 1
        return block

    def _touch(self, block: int) -> None:
        if self.ref_cnt[block] == 0:
            self.free_queue.remove(block)
        self.ref_cnt[block] += 1

    def _release(self, block: int) -> None:
        self.ref_cnt[block] -= 1
        if self.ref_cnt[block] == 0:
            self.free_queue.append(block)

    def allocate(self, seq_id: int, tokens: Sequence[int], salt: int) -> int | None:
        """Blocks for a prompt: the cached run, then blocks loaded from the host, then fresh ones;
        the tokens already computed, or None (nothing changed) when the blocks are short."""
        keys = self.hashes(tokens, salt, (len(tokens) - 1) // self.block_size)
        hit: list[int] = []
        for key in keys:
            if key not in self.cached:
                break
            hit.append(self.cached[key])
        loading = []
        for key in keys[len(hit) :]:
            if key not in self.host_index:
                break
            loading.append(key)
        needed = -(-len(tokens) // self.block_size) - len(hit)
        if needed > len(self.free_queue) - sum(1 for block in hit if self.ref_cnt[block] == 0):
            return None
        for block in hit:
            self._touch(block)
        fresh = [self._pop_free() for _ in range(needed)]
        self.loads[seq_id] = []
        self.computed[seq_id] = (len(hit) + len(loading)) * self.block_size
        for key, block in zip(loading, fresh, strict=False):
            if self.asynchronous:
                self._start(block, self.host_index[key], False, key)
                continue
            host = self.host_index[key]
            self.loads[seq_id].append((host, block))
            if key not in self.cached:
                self.cached[key] = block
                if self.fault != "loaded_unkeyed":
                    self.block_hash[block] = key
        self.tables[seq_id], self.tokens[seq_id], self.salts[seq_id] = hit + fresh, list(tokens), salt
        self.hashed[seq_id] = len(hit) + len(loading)
        return (len(hit) + len(loading)) * self.block_size

    def append_slot(self, seq_id: int, token: int) -> bool:
        table, length = self.tables[seq_id], len(self.tokens[seq_id])
        self.last_copy = None
        if length % self.block_size == 0:
            if not self.free_queue:
                return False
            table.append(self._pop_free())
        elif self.ref_cnt[table[-1]] > (2 if self.fault == "cow_above_2" else 1):
            if not self.free_queue:
                return False
            source = table[-1]
            self.ref_cnt[source] -= 1
            table[-1] = self._pop_free()
            self.last_copy = (source, table[-1])
        self.tokens[seq_id].append(token)
        return True

    def cache_full_blocks(self, seq_id: int, computed: int) -> None:
        full, table = computed // self.block_size, self.tables[seq_id]
        keys = self.hashes(self.tokens[seq_id], self.salts[seq_id], full)
        for index in range(self.hashed[seq_id], full):
            if keys[index] not in self.cached and table[index] not in self.block_hash:
                self.cached[keys[index]] = table[index]
                self.block_hash[table[index]] = keys[index]
        self.hashed[seq_id] = max(self.hashed[seq_id], full)

    def _start(self, block: int, host: int, to_host: bool, key: str) -> int:
        """A copy in flight: it holds its block (but a planted fault's), a load its host block."""
        self._next_copy += 1
        self.in_flight[self._next_copy], self.copy_keys[self._next_copy] = (block, host, to_host), key
        if not (to_host and self.fault == "store_unpinned") and not (not to_host and self.fault == "freed_under_load"):
            self._touch(block)
            self.pins[block] += 1
        if to_host:
            self.host_pending.add(host)
        else:
            self.host_pins[host] = self.host_pins.get(host, 0) + 1
        return self._next_copy

    def complete(self, copy_id: int, ok: bool) -> int | None:
        """A copy in flight ends; for a load into a request's block, the request's computed tokens."""
        block, host, to_host = self.in_flight.pop(copy_id)
        key = self.copy_keys.pop(copy_id)
        if self.pins[block]:
            self.pins[block] -= 1
            self._release(block)
        if to_host:
            self.host_pending.discard(host)
            if ok or self.fault == "failed_store_keyed":
                self.host_key[host], self.host_index[key] = key, host
                self.host_order.append(host)
            else:
                self.host_free.append(host)
            return None
        self.host_pins[host] -= 1
        owner = next((seq for seq, table in self.tables.items() if block in table), None)
        if ok or self.fault == "failed_load_cached":
            if key not in self.cached and block not in self.block_hash:
                self.cached[key], self.block_hash[block] = block, key
        elif owner is not None:
            index = self.tables[owner].index(block)
            self.computed[owner] = min(self.computed[owner], index * self.block_size)
            self.hashed[owner] = min(self.hashed[owner], index)
        return None if owner is None else self.computed[owner]

    def free(self, seq_id: int) -> None:
        table = self.tables.pop(seq_id)
        if self.fault == "free_drops_leases":
            for held in self.leases.values():
                for block in [block for block in held if block in table]:
                    held.remove(block)
                    self._release(block)
        for block in reversed(table):  # the tail first: it is handed out first
            self._release(block)
        del self.tokens[seq_id], self.salts[seq_id], self.hashed[seq_id]
        self.loads.pop(seq_id, None)
        self.computed.pop(seq_id, None)

    def fork(self, parent: int, child: int) -> None:
        for block in self.tables[parent]:
            self.ref_cnt[block] += 1
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        self.salts[child], self.hashed[child] = self.salts[parent], self.hashed[parent]
        self.computed[child] = self.computed[parent]

    def reset_prefix_cache(self) -> bool:
        if any(self.ref_cnt):  # as vLLM: refused while any block is in use
            return False
        self.cached.clear()
        self.block_hash.clear()
        return True

    def lease(self, seq_id: int) -> int:
        self._next_lease += 1
        self.leases[self._next_lease] = list(self.tables[seq_id])
        for block in self.tables[seq_id]:
            self.ref_cnt[block] += 1
        return self._next_lease

    def end_lease(self, lease: int) -> None:
        for block in self.leases.pop(lease):
            self._release(block)

    def offload(self) -> list[tuple[int, int]]:
        """Store the cached blocks the free queue hands out next in the host tier (those it lacks)."""
        stores = []
        for block in list(self.free_queue):
            key = self.block_hash.get(block)
            storing = key in self.copy_keys.values()
            if key is None or key in self.host_index or storing:
                continue
            reusable = [host for host in self.host_order if not self.host_pins.get(host)]
            if self.host_free:
                host = self.host_free.pop()
            elif reusable:
                host = reusable[0]
                self.host_order.remove(host)
                if self.fault != "host_keeps_old_key":
                    del self.host_index[self.host_key[host]]
                del self.host_key[host]
            else:
                break
            if self.asynchronous:
                self._start(block, host, True, key)
            else:
                self.host_key[host], self.host_index[key] = key, host
                self.host_order.append(host)
            stores.append((block, host))
        return stores


class OffloadAdapter:
    """`OffloadBlockManager` behind the adapter protocol, every verb it supports declared; a host
    tier of as many blocks as the device's."""

    capabilities = frozenset(
        {"fork", "copy_on_write", "reset_cache", "atomic", "tenants", "lease", "end_lease", "demote", "promote"}
    )

    def __init__(self, pages: int, page_size: int, fault: str = "", asynchronous: bool = False) -> None:
        self.blocks = OffloadBlockManager(pages, page_size, pages, fault, asynchronous)
        self.pages = pages
        if asynchronous:
            self.capabilities = OffloadAdapter.capabilities | {"async_copies"}

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        return self.blocks.allocate(request_id, tokens, tenant_of(request_id))

    def append(self, request_id: int, token: int) -> bool:
        return self.blocks.append_slot(request_id, token)

    def copies(self) -> list[tuple[int, int]]:
        return [] if self.blocks.last_copy is None else [self.blocks.last_copy]

    def written(self, request_id: int, tokens: int) -> None:
        self.blocks.cache_full_blocks(request_id, tokens)

    def free(self, request_id: int) -> None:
        self.blocks.free(request_id)

    def fork(self, parent_id: int, child_id: int) -> bool:
        self.blocks.fork(parent_id, child_id)
        return True

    def reset_cache(self) -> bool:
        return self.blocks.reset_prefix_cache()

    def lease(self, request_id: int) -> int:
        return self.blocks.lease(request_id)

    def end_lease(self, lease: int) -> list[tuple[int, int]]:
        self.blocks.end_lease(lease)
        return []

    def demote(self) -> list[tuple[int, int]]:
        return self.blocks.offload()

    def promote(self, request_id: int) -> list[tuple[int, int]]:
        return self.blocks.loads.get(request_id, [])

    def complete(self, copy_id: int, ok: bool) -> int | None:
        return self.blocks.complete(copy_id, ok)

    def view(self) -> PoolView:
        blocks = self.blocks
        leased = [0] * self.pages
        for held in blocks.leases.values():
            for block in held:
                leased[block] += 1
        return PoolView(
            holders=tuple(
                count - lease - pins for count, lease, pins in zip(blocks.ref_cnt, leased, blocks.pins, strict=True)
            ),
            free=frozenset(blocks.free_queue),
            tables={seq_id: tuple(table) for seq_id, table in blocks.tables.items()},
            cached=dict(blocks.block_hash),
            leased={block: count for block, count in enumerate(leased) if count},
            host=dict(blocks.host_key),
            host_free=frozenset(blocks.host_free),
            host_pages=self.pages,
            host_pending=frozenset(blocks.host_pending),
            in_flight=dict(blocks.in_flight),
        )


def correct(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size)


def cow_above_2(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "cow_above_2")


def unsalted(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "unsalted")


def host_keeps_old_key(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "host_keeps_old_key")


def free_drops_leases(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "free_drops_leases")


def loaded_unkeyed(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "loaded_unkeyed")


def asynchronous(pages: int, page_size: int) -> OffloadAdapter:
    """The offload toy with its copies in flight until the engine completes them."""
    return OffloadAdapter(pages, page_size, asynchronous=True)


def store_unpinned(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "store_unpinned", asynchronous=True)


def failed_store_keyed(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "failed_store_keyed", asynchronous=True)


def failed_load_cached(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "failed_load_cached", asynchronous=True)


def freed_under_load(pages: int, page_size: int) -> OffloadAdapter:
    return OffloadAdapter(pages, page_size, "freed_under_load", asynchronous=True)
