"""`KvschedBlockPool`: vLLM's `BlockPool` with kvsched's evictable reserve deciding ownership.

The reserve (`kvsched.impl.reserve`, refining `kvsched.spec.reserve`) holds every reference
count, the free queue's order and the cache index. vLLM's `KVCacheBlock` objects are views:
`ref_cnt` reads the reserve's count (raising it directly is a `touch`), `free_block_queue`
reads the reserve's queue (`ReserveQueue`), and the pool keeps vLLM's hash map beside the
reserve's index, so vLLM's code and tests that walk them see what kvsched decided. vLLM's
null block (block 0) is the reserve's reserved page; its `ref_cnt` is vLLM's own unmaintained
counter, which 0.32 moves on `touch` and `free_blocks` and later releases leave alone.

What differs between the tested releases is read from `kvsched.integrations.vllm.names.RELEASES`
(and every vLLM name used here is checked at import against that module's table): 0.34's
`free_blocks(..., evict_first=True)` is the reserve's `free_evict_first`, its blocks point to
their pool weakly, and its hash map holds block ids.

Everything else (events, metrics, partial-block keys, reuse watchers) is vLLM's code, reached
through the two primitives every cache change goes through (`_insert_block_hash`,
`_remove_cached_block_hashes`). With `debug` on (`KVSCHED_VLLM_DEBUG=1`), every call ends by
checking the views against the reserve and the reserve's invariants against the spec's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

from kvsched.integrations.vllm import require_tested_vllm

require_tested_vllm()  # without vLLM, or under another release: UnsupportedVllm naming what to install

from kvsched.integrations.vllm.names import require_names  # noqa: E402

RELEASE = require_names()  # every name below is where this release has it, or UnsupportedVllm

import vllm.v1.core.block_pool as vllm_block_pool  # noqa: E402  (after the version check)
import vllm.v1.core.kv_cache_coordinator as vllm_coordinator  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)

from kvsched.impl.reserve import Reserve  # noqa: E402
from kvsched.integrations.vllm.hash_map import read_hash_map  # noqa: E402
from kvsched.spec import reserve as spec_reserve  # noqa: E402
from kvsched.spec.errors import CacheInUse, Exhausted, InvalidArgument  # noqa: E402

logger = vllm_block_pool.logger  # vLLM's own pool logger: its logging settings apply

VLLM_BLOCK_POOL: type[Any] = vllm_block_pool.BlockPool  # vLLM's own, kept before any rebinding

F = TypeVar("F", bound=Callable[..., Any])


class ReserveBlock(KVCacheBlock):  # type: ignore[misc]
    """A vLLM block whose `ref_cnt` is its page's count in the reserve (`refs` is the reserve's
    own list of counts, which it only ever changes in place)."""

    __slots__ = ("refs", "reserve")
    refs: list[int]
    reserve: Reserve

    @property
    def ref_cnt(self) -> int:
        return self.refs[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        try:
            reserve: Reserve = self.reserve
        except AttributeError:  # vLLM's constructor sets 0 before the block joins its reserve
            return
        current = reserve.refs[self.block_id]
        if value == current:
            return
        if value < current or current == 0:
            raise InvalidArgument(
                f"block {self.block_id}: ref_cnt {current} cannot be set to {value} directly; a held"
                " block's count may be raised (an extra holder), a free one is taken by touch or"
                " get_new_blocks, and a block is released through free_blocks"
            )
        reserve.touch([self.block_id] * (value - current))


class ReserveQueue:
    """vLLM's free block queue, read from the reserve, whose queue it is.

    It answers what vLLM's `FreeKVCacheBlockQueue` answers to its readers: the count, the
    blocks in order, iteration after a cursor, and the linked list itself (`fake_free_list_head`,
    `fake_free_list_tail`, each free block's `prev_free_block` and `next_free_block`), linked
    afresh whenever the queue has changed since the last reader asked. Only the pool changes
    the queue, through the reserve: its mutators refuse.
    """

    def __init__(self, blocks: list[KVCacheBlock], reserve: Reserve) -> None:
        self._blocks = blocks
        self._reserve = reserve
        self._linked: tuple[tuple[int, ...], Any] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._reserve.queue)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks = self._blocks
        return [blocks[page] for page in self._reserve.queue]

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        pages = iter(tuple(self._reserve.queue))
        if cursor is not None and not any(page == cursor.block_id for page in pages):
            return  # the cursor is no longer free: nothing follows it
        blocks = self._blocks
        for page in pages:
            yield blocks[page]

    def _link(self) -> Any:
        queue = tuple(self._reserve.queue)
        if self._linked is None or self._linked[0] != queue:
            for block in self._blocks:
                block.prev_free_block = block.next_free_block = None
            self._linked = (queue, FreeKVCacheBlockQueue(self.get_all_free_blocks()))
        return self._linked[1]

    @property
    def fake_free_list_head(self) -> KVCacheBlock:
        return cast(KVCacheBlock, self._link().fake_free_list_head)

    @property
    def fake_free_list_tail(self) -> KVCacheBlock:
        return cast(KVCacheBlock, self._link().fake_free_list_tail)

    def _refuse(self, *args: object) -> None:
        raise TypeError("kvsched's free queue is changed by the pool alone, through its reserve")

    popleft = popleft_n = remove = append = append_n = prepend_n = _refuse


DEBUG = os.environ.get("KVSCHED_VLLM_DEBUG") == "1"


def _checked(method: F) -> F:
    """In debug mode (`KVSCHED_VLLM_DEBUG=1` when this module is imported), check the views
    against the reserve after the call; otherwise the method itself."""
    if not DEBUG:
        return method

    @functools.wraps(method)
    def call(self: KvschedBlockPool, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        self.check()
        return result

    return cast(F, call)


class KvschedBlockPool(VLLM_BLOCK_POOL):  # type: ignore[misc]
    """vLLM's `BlockPool` over kvsched's evictable reserve; same constructor, same API."""

    reserve_class: Callable[..., Reserve] = Reserve
    debug: bool = DEBUG

    def __init__(
        self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, *args, **kwargs)
        self.reserve = self.reserve_class(num_gpu_blocks, reserved=(0,), caching=enable_caching)
        self.pool_ref: Any = self._weak_self if RELEASE.weak_pool else self  # what a block's `pool` holds
        # Block 0 is vLLM's null block, a plain one: its count is vLLM's own, unmaintained.
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(0, pool=self.pool_ref)]
        for page in range(1, num_gpu_blocks):
            block = ReserveBlock(page, pool=self.pool_ref)
            block.refs, block.reserve = self.reserve.refs, self.reserve
            self.blocks.append(block)
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_block_queue = ReserveQueue(self.blocks, self.reserve)
        if RELEASE.map_of_ids:  # the map reads blocks by id from the pool's list
            self.cached_block_hash_to_block = vllm_block_pool.BlockHashToBlockMap(self.blocks)
        if self.debug:
            self.check()

    # -- ownership: every decision is the reserve's -------------------------------------------

    @_checked
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        try:
            pages = self.reserve.allocate(num_blocks)
        except Exhausted as error:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool") from error
        blocks = self.blocks
        taken = [blocks[page] for page in pages]
        if self._reuse_watchers:
            self._notify_reuse(taken)
        metrics = self.metrics_collector
        if self.enable_caching:
            by_block = self.cached_block_hashes_by_block
            for block in taken:  # the reserve evicted; vLLM's map, events and metrics follow
                if metrics or block.block_hash is not None or block.block_id in by_block:
                    self._maybe_evict_cached_block(block)
                if metrics:
                    metrics.on_block_allocated(block)
        elif metrics:
            for block in taken:
                metrics.on_block_allocated(block)
        return taken

    @_checked
    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        pages = [block.block_id for block in blocks]
        self.reserve.touch(pages)
        if RELEASE.null_block_counted and 0 in pages:
            self.null_block.ref_cnt += pages.count(0)  # vLLM's unmaintained count on its null block
        metrics = self.metrics_collector
        if metrics:
            for block in blocks:
                metrics.on_block_accessed(block)

    @_checked
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], evict_first: bool = False) -> None:
        if evict_first and not RELEASE.evict_first:
            raise TypeError(f"vLLM {RELEASE.version}'s free_blocks takes no evict_first")
        pages: list[int] = []
        other_pools: dict[Any, list[KVCacheBlock]] = {}
        mine = self.pool_ref
        for block in ordered_blocks:
            pool = block.pool
            if pool is mine or pool is None:
                pages.append(block.block_id)
            elif RELEASE.weak_pool:
                owner = pool()
                if owner is not None:  # a pool that is gone frees nothing
                    other_pools.setdefault(owner, []).append(block)
            else:
                other_pools.setdefault(pool, []).append(block)
        # The null block is reserved: the reserve leaves it be.
        (self.reserve.free_evict_first if evict_first else self.reserve.free)(pages)
        if RELEASE.null_block_counted and 0 in pages:
            self.null_block.ref_cnt -= pages.count(0)  # vLLM's unmaintained count on it
        for pool, theirs in other_pools.items():
            if RELEASE.evict_first:
                pool.free_blocks(theirs, evict_first=evict_first)
            else:
                pool.free_blocks(theirs)

    @_checked
    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Callable[[KVCacheBlock], None]) -> None:
        chosen = list(blocks)
        self.reserve.unpin([block.block_id for block in chosen])
        for block in chosen:
            self._reuse_watchers[block.block_id] = on_reuse

    def get_cached_block(self, block_hash: Any, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        pages_by_key = self.reserve.pages_by_key  # the reserve's index: a key's first page is its hit
        if len(kv_cache_group_ids) == 1:  # one attention type: the common case
            pages = pages_by_key.get(make_block_hash_with_group_id(block_hash, kv_cache_group_ids[0]))
            return [self.blocks[next(iter(pages))]] if pages else None
        found: list[KVCacheBlock] = []
        for group_id in kv_cache_group_ids:
            pages = pages_by_key.get(make_block_hash_with_group_id(block_hash, group_id))
            if not pages:
                return None
            found.append(self.blocks[next(iter(pages))])
        return found

    def get_num_free_blocks(self) -> int:
        return len(self.reserve.queue)

    @_checked
    def reset_prefix_cache(self) -> bool:
        try:
            self.reserve.reset()
        except CacheInUse as error:
            logger.warning("Failed to reset prefix cache: %s", error)
            return False
        reset = bool(super().reset_prefix_cache())
        assert reset, "the reserve and vLLM's count of used blocks disagree"
        return reset

    # -- the two primitives every cache change goes through -----------------------------------

    def _insert_block_hash(self, block_hash_with_group_id: Any, block: KVCacheBlock, num_tokens: int | None) -> None:
        self.reserve.register(block_hash_with_group_id, block.block_id)
        super()._insert_block_hash(block_hash_with_group_id, block, num_tokens)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[Any]:
        self.reserve.forget(block.block_id)
        return cast(list[Any], super()._remove_cached_block_hashes(block))

    # -- the views against the reserve --------------------------------------------------------

    def check(self) -> None:
        """Raise `AssertionError` unless vLLM's views show exactly the reserve's state."""
        reserve = self.reserve
        state = reserve.to_spec()
        broken = spec_reserve.check_reserve(state)
        assert not broken, f"the reserve breaks {broken}"
        for block in self.blocks[1:]:
            assert block.reserve is reserve and block.refs is reserve.refs
            cached = block.block_hash is not None
            assert cached == reserve.is_cached(block.block_id), f"block {block.block_id}: cached {cached} in vLLM"
            for key in reserve.keys_of(block.block_id):
                assert self.cached_block_hash_to_block.contain(key, block.block_id), f"key of {block.block_id} lost"
        registrations = sum(len(reserve.keys_of(page)) for page in range(reserve.pages))
        assert read_hash_map(self.cached_block_hash_to_block, RELEASE.map_of_ids).pairs() == registrations


def choose_reserve() -> None:
    """Put the reserve `KVSCHED_VLLM_RESERVE=MODULE:CLASS` names under every pool from now on
    (how `make vllm` shows vLLM's tests and the greedy comparison catch a wrong one)."""
    chosen = os.environ.get("KVSCHED_VLLM_RESERVE")
    if chosen:
        module, _, name = chosen.partition(":")
        KvschedBlockPool.reserve_class = getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def substituted() -> Iterator[None]:
    """Inside the block, vLLM's coordinator builds a `KvschedBlockPool` where it builds a pool;
    after it, whatever it built before (no rebinding outlives the block)."""
    choose_reserve()
    before = vllm_coordinator.BlockPool
    vllm_coordinator.BlockPool = KvschedBlockPool
    try:
        yield
    finally:
        vllm_coordinator.BlockPool = before


class KvschedKVCacheManager(KVCacheManager):  # type: ignore[misc]
    """vLLM's `KVCacheManager`, its coordinator's pool a `KvschedBlockPool` (substituted for
    its construction alone: a pool built elsewhere, such as the CPU-offload tier's, which
    vLLM builds through the coordinator factory outside any manager, stays vLLM's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with substituted():
            super().__init__(*args, **kwargs)
        if not isinstance(self.block_pool, KvschedBlockPool):
            raise TypeError(f"the manager's block pool is {type(self.block_pool).__qualname__}, not KvschedBlockPool")


def install() -> None:
    """Rebind vLLM's `BlockPool` where its managers and tests look it up, over the reserve
    `KVSCHED_VLLM_RESERVE` names, if any, until `uninstall()` (process-wide: how vLLM's own
    tests run over kvsched's pool; a scheduler substitutes it for its own construction only)."""
    choose_reserve()
    vllm_block_pool.BlockPool = KvschedBlockPool
    vllm_coordinator.BlockPool = KvschedBlockPool


def uninstall() -> None:
    """Give vLLM its own `BlockPool` back."""
    vllm_block_pool.BlockPool = VLLM_BLOCK_POOL
    vllm_coordinator.BlockPool = VLLM_BLOCK_POOL
