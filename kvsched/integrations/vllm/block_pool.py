"""`KvschedBlockPool`: vLLM's `BlockPool` with kvsched's evictable reserve deciding ownership.

The reserve (`kvsched.impl.reserve`, refining `kvsched.spec.reserve`) holds every reference
count, the free queue's order and the cache index. vLLM's `KVCacheBlock` objects are views:
`ref_cnt` reads the reserve's count (raising it directly is a `touch`), `free_block_queue`
reads the reserve's queue (`ReserveQueue`) and `cached_block_hash_to_block` reads the reserve's
index (`ReserveHashMap`: there is no second map to keep in step), so vLLM's code and tests that
walk them see what kvsched decided. A block's own key fields (`block_hash`, and the pool's
`cached_block_hashes_by_block` for its further keys) are vLLM's, set as the reserve registers
and cleared as it forgets. vLLM's null block (block 0) is the reserve's reserved page; its
`ref_cnt` is vLLM's own unmaintained counter, which 0.32 moves on `touch` and `free_blocks` and
later releases leave alone.

What differs between the tested releases is read from `kvsched.integrations.vllm.names.RELEASES`
(and every vLLM name used here is checked at import against that module's table): 0.34's
`free_blocks(..., evict_first=True)` is the reserve's `free_evict_first`, its blocks point to
their pool weakly, and 0.33 and 0.34 publish a block only once the lookahead tokens its key
covers exist (`cache_full_blocks` refuses an earlier publication: `spec.reserve.publishable`).

Everything else (events, metrics, partial-block keys, reuse watchers) is vLLM's code, reached
through the two primitives every cache change goes through (`_insert_block_hash`,
`_remove_cached_block_hashes`). With `debug` on (`KVSCHED_VLLM_DEBUG=1`), every call ends by
checking the views against the reserve and the reserve's invariants against the spec's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
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
from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager  # noqa: E402

from kvsched.impl.reserve import Reserve  # noqa: E402
from kvsched.integrations.vllm.hash_map import read_hash_map  # noqa: E402
from kvsched.spec import refusals  # noqa: E402
from kvsched.spec import reserve as spec_reserve  # noqa: E402
from kvsched.spec.errors import CacheInUse, Exhausted, InvalidArgument  # noqa: E402

logger = vllm_block_pool.logger  # vLLM's own pool logger: its logging settings apply

VLLM_BLOCK_POOL: type[Any] = vllm_block_pool.BlockPool  # vLLM's own, kept before any rebinding
VLLM_CACHE_FULL_BLOCKS = VLLM_BLOCK_POOL.cache_full_blocks  # called directly: a hot path
VLLM_COUNT_EVICTABLE = SingleTypeKVCacheManager._get_num_evictable_blocks.__func__  # vLLM's own, unbound

F = TypeVar("F", bound=Callable[..., Any])
BLOCK_ID = operator.attrgetter("block_id")
GROUPS_AHEAD = 64  # KV cache groups whose key suffix a pool works out once
BLOCK_HASH = operator.attrgetter("block_hash")  # a key is non-empty bytes: true when cached


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


class ReserveHashMap:
    """vLLM's prefix-cache hash map (`BlockHashToBlockMap`), read from the reserve's index.

    The reserve holds the only index: vLLM's code finds a key's block, asks whether a key names a
    block and counts keys through this view; `_cache` (and 0.34's `_dup_ids`) are built in this
    release's shape whenever a reader asks. Only the pool registers and forgets, through its
    reserve: `insert` of a pair the reserve does not hold, `pop` and `clear` of a live cache refuse.
    """

    def __init__(self, blocks: list[KVCacheBlock], reserve: Reserve) -> None:
        self._blocks = blocks
        self._reserve = reserve

    def get_one_block(self, key: Any) -> KVCacheBlock | None:
        page = self._reserve.page_by_key.get(key)
        return None if page is None else self._blocks[page]

    def contain(self, key: Any, block_id: int) -> bool:
        return key in self._reserve.keys_of(block_id)

    def insert(self, key: Any, block: KVCacheBlock) -> None:
        if not self.contain(key, block.block_id):
            self._refuse()

    def pop(self, key: Any, block_id: int) -> KVCacheBlock | None:
        self._refuse()
        return None

    def clear(self) -> None:
        if len(self):
            self._refuse()

    def __len__(self) -> int:
        return len(self._reserve.page_by_key)

    def _refuse(self) -> None:
        raise TypeError("kvsched's prefix-cache map is its reserve's index: the pool alone changes it")

    @property
    def _cache(self) -> dict[Any, Any]:
        reserve, blocks = self._reserve, self._blocks
        if RELEASE.map_of_ids:  # 0.34: a key's first block id
            return dict(reserve.page_by_key)
        cache: dict[Any, Any] = {}  # 0.32, 0.33: a key's block, or its blocks by id
        for key in reserve.page_by_key:
            pages = reserve.pages_of(key)
            cache[key] = blocks[pages[0]] if len(pages) == 1 else {page: blocks[page] for page in pages}
        return cache

    @property
    def _dup_ids(self) -> dict[Any, dict[int, None]]:
        reserve = self._reserve
        shared = ((key, reserve.pages_of(key)) for key in reserve.page_by_key)
        return {key: dict.fromkeys(pages) for key, pages in shared if len(pages) > 1}


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

    def count_evictable(self, blocks: Sequence[KVCacheBlock]) -> int:
        """How many of `blocks` only the cache holds (count 0) and are not the null block: vLLM's
        `SingleTypeKVCacheManager._get_num_evictable_blocks`, read from the reserve's counts."""
        refs = self.reserve.refs
        return sum(1 for block in blocks if not refs[block.block_id] and not block.is_null)

    def __init__(
        self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, *args, **kwargs)
        for block in self.blocks:  # vLLM's own blocks, replaced below: unlinked, freed at once
            block.prev_free_block = block.next_free_block = None  # (not left as cycles for the GC)
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
        self.lookahead: int = getattr(self, "num_hash_lookahead_tokens", 0)  # 0.33 on; 0.32 has none
        self._page_of = self.reserve.page_by_key.get  # the reserve changes its index in place
        # Asked on every allocate_slots: the queue's own length, no frame of ours (the reserve
        # changes its queue in place).
        self.get_num_free_blocks = self.reserve.queue.__len__  # type: ignore[method-assign]
        # What vLLM appends to a block hash to make its key in each group: a key is the hash's
        # bytes then the group's (`make_block_hash_with_group_id`, which vLLM's own
        # `cache_full_blocks` reads the same way, once per call).
        self._group_suffixes = [bytes(make_block_hash_with_group_id(b"", group)) for group in range(GROUPS_AHEAD)]
        self.hash_map = ReserveHashMap(self.blocks, self.reserve)
        self.cached_block_hash_to_block = self.hash_map
        if self.debug:
            self.check()

    # -- ownership: every decision is the reserve's -------------------------------------------

    @_checked
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        try:
            pages = self.reserve.allocate(num_blocks)
        except Exhausted as error:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool") from error
        if len(pages) == 1:  # decode's common case
            block = self.blocks[pages[0]]
            taken = [block]
            evicted = block.block_hash is not None
        else:
            blocks = self.blocks
            taken = [blocks[page] for page in pages]
            evicted = any(map(BLOCK_HASH, taken))
        if evicted or self._reuse_watchers or self.metrics_collector:
            self._allocated(taken)
        return taken

    def _allocated(self, taken: list[KVCacheBlock]) -> None:
        """What vLLM does for blocks it hands out, beyond the reserve's work: reuse watchers, and
        for a block the reserve evicted (vLLM's block still carries its keys) its events, the
        metrics' eviction, then their allocation."""
        if self._reuse_watchers:
            self._notify_reuse(taken)
        metrics = self.metrics_collector
        for block in taken:
            if self.enable_caching and (metrics or block.block_hash is not None):
                self._maybe_evict_cached_block(block)  # a block's other keys come with a first
            if metrics:
                metrics.on_block_allocated(block)

    @_checked
    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        pages = list(map(BLOCK_ID, blocks))
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
        page_of = self._page_of  # the reserve's index: a key's first page is its hit
        suffixes = self._group_suffixes
        if len(kv_cache_group_ids) == 1:  # one attention type: the common case
            group_id = kv_cache_group_ids[0]
            try:
                page = page_of(block_hash + suffixes[group_id])
            except IndexError:  # a group id past those worked out ahead
                page = page_of(make_block_hash_with_group_id(block_hash, group_id))
            return None if page is None else [self.blocks[page]]
        found: list[KVCacheBlock] = []
        for group_id in kv_cache_group_ids:
            page = page_of(make_block_hash_with_group_id(block_hash, group_id))
            if page is None:
                return None
            found.append(self.blocks[page])
        return found

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        if num_full_blocks > num_cached_blocks and not spec_reserve.publishable(
            num_full_blocks, block_size, request.num_tokens, self.lookahead
        ):
            raise refusals.early_publication(num_full_blocks, block_size, request.num_tokens, self.lookahead)
        if (  # decode's common case, one newly full block: vLLM's loop for it, without its setup
            num_full_blocks == num_cached_blocks + 1
            and block_mask is None
            and block_size == self.hash_block_size
            and not self.enable_kv_cache_events
            and kv_cache_group_id < GROUPS_AHEAD
        ):
            block = blocks[num_cached_blocks]
            if block.block_hash is None and not block.is_null:
                key = request.block_hashes[num_cached_blocks] + self._group_suffixes[kv_cache_group_id]
                self.reserve.register(key, block.block_id)
                block.set_block_hash(key, num_tokens=num_full_blocks * block_size)
                return
        VLLM_CACHE_FULL_BLOCKS(
            self, request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, block_mask
        )

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
        self.cached_block_hash_to_block = self.hash_map  # 0.32 and 0.33 put a new map of their own
        return reset

    # -- the two primitives every cache change goes through -----------------------------------

    def _insert_block_hash(self, block_hash_with_group_id: Any, block: KVCacheBlock, num_tokens: int | None) -> None:
        key = block_hash_with_group_id
        first = block.block_hash
        if first is None:  # the block's first key
            self.reserve.register(key, block.block_id)
            block.set_block_hash(key, num_tokens=num_tokens)
        elif first != key and key not in self.reserve.keys_of(block.block_id):  # one more key
            self.reserve.register(key, block.block_id)
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[Any]:
        first = block.block_hash
        if first is None:  # a block's other keys come with a first
            return []
        keys = [first, *self.cached_block_hashes_by_block.pop(block.block_id, ())]
        self.reserve.forget(block.block_id)  # nothing left when the reserve evicted it to allocate it
        block.reset_hash()
        return keys  # what vLLM's map held, for its events

    # -- the views against the reserve --------------------------------------------------------

    def check(self) -> None:
        """Raise `AssertionError` unless vLLM's views show exactly the reserve's state."""
        reserve = self.reserve
        state = reserve.to_spec()
        broken = spec_reserve.check_reserve(state)
        assert not broken, f"the reserve breaks {broken}"
        assert self.cached_block_hash_to_block is self.hash_map, "vLLM's hash map is not the reserve's view"
        by_block = self.cached_block_hashes_by_block
        for block in self.blocks[1:]:
            assert block.reserve is reserve and block.refs is reserve.refs
            first, *later = reserve.keys_of(block.block_id) or (None,)
            assert block.block_hash == first, f"block {block.block_id}: vLLM's key is not the reserve's first"
            assert by_block.get(block.block_id, set()) == set(later), f"block {block.block_id}: other keys differ"
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
        pool = self.block_pool
        if not isinstance(pool, KvschedBlockPool):
            raise TypeError(f"the manager's block pool is {type(pool).__qualname__}, not KvschedBlockPool")
        # Each admission asks its single-type managers how many of its prefix hits only the cache
        # holds; vLLM's count reads every hit's `ref_cnt`, a property here. This manager's own
        # single-type managers count them from the reserve's counts instead (an instance
        # attribute: vLLM's class, and every other manager, keep vLLM's count).
        for manager in self.coordinator.single_type_managers:
            if getattr(type(manager)._get_num_evictable_blocks, "__func__", None) is VLLM_COUNT_EVICTABLE:
                manager._get_num_evictable_blocks = pool.count_evictable


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
