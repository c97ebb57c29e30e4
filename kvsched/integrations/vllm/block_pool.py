"""`KvschedBlockPool`: vLLM's `BlockPool` with kvsched's evictable reserve deciding ownership.

The reserve (`kvsched.impl.reserve`, refining `kvsched.spec.reserve`) holds every reference
count, the free queue's order and the cache index. vLLM's `KVCacheBlock` objects are views:
`ref_cnt` reads the reserve's count (raising it directly is a `touch`), and the pool keeps
vLLM's `FreeKVCacheBlockQueue` and hash map in the reserve's order so vLLM's code and tests
that walk them see what kvsched decided. vLLM's null block (block 0) is the reserve's reserved
page; its `ref_cnt` is vLLM's own unmaintained counter, as in vLLM.

Everything else (events, metrics, partial-block keys, reuse watchers) is vLLM's code, reached
through the two primitives every cache change goes through (`_insert_block_hash`,
`_remove_cached_block_hashes`). With `debug` on (`KVSCHED_VLLM_DEBUG=1`), every call ends by
checking the views against the reserve and the reserve's invariants against the spec's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from kvsched.integrations.vllm import require_tested_vllm

require_tested_vllm()

import vllm.v1.core.block_pool as vllm_block_pool  # noqa: E402  (after the version check)
import vllm.v1.core.kv_cache_coordinator as vllm_coordinator  # noqa: E402
from vllm.logger import init_logger  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)

from kvsched.impl.reserve import Reserve  # noqa: E402
from kvsched.spec import reserve as spec_reserve  # noqa: E402
from kvsched.spec.errors import CacheInUse, Exhausted, InvalidArgument  # noqa: E402

logger = init_logger(__name__)

VLLM_BLOCK_POOL: type[Any] = vllm_block_pool.BlockPool  # vLLM's own, kept before any rebinding
_COUNT = cast(Any, KVCacheBlock).ref_cnt  # the slot vLLM's block stores its count in

F = TypeVar("F", bound=Callable[..., Any])


class ReserveBlock(KVCacheBlock):  # type: ignore[misc]
    """A vLLM block whose `ref_cnt` is its page's count in the reserve."""

    __slots__ = ("reserve",)

    @property
    def ref_cnt(self) -> int:
        reserve: Reserve | None = getattr(self, "reserve", None)
        if reserve is None or self.block_id in reserve.reserved:
            return cast(int, _COUNT.__get__(self))
        return reserve.refs[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        reserve: Reserve | None = getattr(self, "reserve", None)
        if reserve is None or self.block_id in reserve.reserved:
            _COUNT.__set__(self, value)
            return
        current = reserve.refs[self.block_id]
        if value < current:
            raise InvalidArgument(
                f"block {self.block_id}: ref_cnt {current} cannot be lowered to {value} directly;"
                " release a block through free_blocks"
            )
        reserve.touch([self.block_id] * (value - current))


def _checked(method: F) -> F:
    """In debug mode, check the views against the reserve after the call."""

    @functools.wraps(method)
    def call(self: KvschedBlockPool, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if self.debug:
            self.check()
        return result

    return cast(F, call)


class KvschedBlockPool(VLLM_BLOCK_POOL):  # type: ignore[misc]
    """vLLM's `BlockPool` over kvsched's evictable reserve; same constructor, same API."""

    reserve_class: Callable[..., Reserve] = Reserve
    debug: bool = os.environ.get("KVSCHED_VLLM_DEBUG") == "1"

    def __init__(
        self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, *args, **kwargs)
        self.reserve = self.reserve_class(num_gpu_blocks, reserved=(0,), caching=enable_caching)
        self.blocks: list[ReserveBlock] = [ReserveBlock(page, pool=self) for page in range(num_gpu_blocks)]
        for block in self.blocks:
            block.reserve = self.reserve
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
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
        taken: list[KVCacheBlock] = self.free_block_queue.popleft_n(len(pages))
        if [block.block_id for block in taken] != list(pages):  # a reserve of another order
            self.free_block_queue.prepend_n(taken)
            taken = [blocks[page] for page in pages]
            for block in taken:
                self.free_block_queue.remove(block)
        if self._reuse_watchers:
            self._notify_reuse(taken)
        metrics = self.metrics_collector
        if self.enable_caching:
            for block in taken:
                self._maybe_evict_cached_block(block)
                if metrics:
                    metrics.on_block_allocated(block)
        elif metrics:
            for block in taken:
                metrics.on_block_allocated(block)
        return taken

    @_checked
    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        reserve = self.reserve
        refs = reserve.refs
        revived = {
            block.block_id: block
            for block in blocks
            if block.block_id not in reserve.reserved and refs[block.block_id] == 0
        }
        reserve.touch([block.block_id for block in blocks])
        for block in revived.values():
            self.free_block_queue.remove(block)
        metrics = self.metrics_collector
        for block in blocks:
            if block.block_id in reserve.reserved:
                block.ref_cnt += 1  # vLLM's unmaintained count on its null block
            if metrics:
                metrics.on_block_accessed(block)

    @_checked
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        own: list[KVCacheBlock] = []
        null: list[KVCacheBlock] = []
        other_pools: dict[Any, list[KVCacheBlock]] = {}
        reserved = self.reserve.reserved
        for block in ordered_blocks:
            if block.pool is not None and block.pool is not self:
                other_pools.setdefault(block.pool, []).append(block)
            elif block.block_id in reserved:
                null.append(block)
            else:
                own.append(block)
        freed = self.reserve.free([block.block_id for block in own])
        for block in null:
            block.ref_cnt -= 1
        blocks = self.blocks
        self.free_block_queue.prepend_n([blocks[page] for page in freed.front])
        self.free_block_queue.append_n([blocks[page] for page in freed.back])
        for pool, theirs in other_pools.items():
            pool.free_blocks(theirs)

    @_checked
    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Callable[[KVCacheBlock], None]) -> None:
        chosen = list(blocks)
        freed = self.reserve.unpin([block.block_id for block in chosen])
        for block in chosen:
            self._reuse_watchers[block.block_id] = on_reuse
        self.free_block_queue.append_n([self.blocks[page] for page in freed.back])

    def get_cached_block(self, block_hash: Any, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        found: list[KVCacheBlock] = []
        lookup = self.reserve.lookup
        for group_id in kv_cache_group_ids:
            page = lookup(make_block_hash_with_group_id(block_hash, group_id))
            if page is None:
                return None
            found.append(self.blocks[page])
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
        queue = [block.block_id for block in self.free_block_queue.get_all_free_blocks()]
        assert queue == list(state.queue), f"vLLM's free queue {queue} is not the reserve's {list(state.queue)}"
        assert self.free_block_queue.num_free_blocks == len(state.queue)
        for block in self.blocks:
            assert block.reserve is reserve
            cached = block.block_hash is not None
            assert cached == reserve.is_cached(block.block_id), f"block {block.block_id}: cached {cached} in vLLM"
            for key in reserve.keys_of(block.block_id):
                assert self.cached_block_hash_to_block.contain(key, block.block_id), f"key of {block.block_id} lost"
        registrations = sum(len(reserve.keys_of(page)) for page in range(reserve.pages))
        assert sum(_count(blocks) for blocks in self.cached_block_hash_to_block._cache.values()) == registrations


def _count(blocks: object) -> int:
    return len(blocks) if isinstance(blocks, dict) else 1


def install() -> None:
    """Rebind vLLM's `BlockPool` where its managers and tests look it up."""
    vllm_block_pool.BlockPool = KvschedBlockPool
    vllm_coordinator.BlockPool = KvschedBlockPool


def uninstall() -> None:
    """Give vLLM its own `BlockPool` back."""
    vllm_block_pool.BlockPool = VLLM_BLOCK_POOL
    vllm_coordinator.BlockPool = VLLM_BLOCK_POOL
