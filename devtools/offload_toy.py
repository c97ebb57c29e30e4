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
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence

from kvsched.testing import PoolView
from kvsched.testing.adapter import tenant_of

FAULTS = ("cow_above_2", "unsalted", "host_keeps_old_key", "free_drops_leases", "loaded_unkeyed")


class OffloadBlockManager:
    """Reference-counted blocks, a hashed prefix cache, leases and a host tier of `host_blocks`."""

    def __init__(self, num_blocks: int, block_size: int, host_blocks: int, fault: str = "") -> None:
        self.block_size, self.fault = block_size, fault
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
        for key, block in zip(loading, fresh, strict=False):
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

    def fork(self, parent: int, child: int) -> None:
        for block in self.tables[parent]:
            self.ref_cnt[block] += 1
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        self.salts[child], self.hashed[child] = self.salts[parent], self.hashed[parent]

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
            if key is None or key in self.host_index:
                continue
            if self.host_free:
                host = self.host_free.pop()
            elif self.host_order:
                host = self.host_order.popleft()
                if self.fault != "host_keeps_old_key":
                    del self.host_index[self.host_key[host]]
            else:
                break
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

    def __init__(self, pages: int, page_size: int, fault: str = "") -> None:
        self.blocks = OffloadBlockManager(pages, page_size, pages, fault)
        self.pages = pages

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

    def view(self) -> PoolView:
        blocks = self.blocks
        leased = [0] * self.pages
        for held in blocks.leases.values():
            for block in held:
                leased[block] += 1
        return PoolView(
            holders=tuple(count - lease for count, lease in zip(blocks.ref_cnt, leased, strict=True)),
            free=frozenset(blocks.free_queue),
            tables={seq_id: tuple(table) for seq_id, table in blocks.tables.items()},
            cached=dict(blocks.block_hash),
            leased={block: count for block, count in enumerate(leased) if count},
            host=dict(blocks.host_key),
            host_free=frozenset(blocks.host_free),
            host_pages=self.pages,
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
