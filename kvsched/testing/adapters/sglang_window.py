"""SGLang's radix cache for all-sliding-window models behind the adapter protocol (`sglang` 0.5.23),
with "groups": one `Window` group.

A model whose every layer is sliding-window attention runs on SGLang's `PureSWARadixCache` (a
`RadixCache`) over `PureSWATokenToKVPoolAllocator` (one SWA pool, page size 1, slot 0 its dummy)
and an `SWAKVPool` with no full-attention layer. The adapter drives them as
`kvsched.testing.adapters.sglang.SglangRadixCache` drives SGLang's radix cache, and adds what the
scheduler adds for such a model: before a request's decode, once `check_decode_mem` found room for
it (a decode short of room is retracted, nothing slid), `ScheduleBatch.maybe_evict_swa` slides
its window (`tree_cache.evict_sliding_windows(req, req.seqlen - 1)`, which frees the request's own
slots wholly behind its window: `free_swa_out_of_window_slots`), once the request has decoded
(`decode_batch_idx >= 1`) and the window has moved past what was freed (the eviction interval
is 1). A request publishes to the tree after its prefill (`checkpoint_kv_cache`), not after a
decode, and the rest at release (`release_kv_cache`). The view shows each position a slide freed
as the dummy page 0 (what no query reads any more): the row still names the freed slot, which the
allocator may hand out again.

The window SGLang keeps behind a query is `sliding_window_size` positions, the query's own apart, so
the group the harness checks is `Window(window + 1)`. `prefill_aware` is the scheduler's
`prefill_aware_swa` (a model property): the prompt is never window-evicted (`swa_evict_floor`),
and a release caches only the prompt. Without it, a release caches slots the window already freed
(SGLang PR #31486's bug: `devtools/sglang/variants.py`'s `FOUND`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvsched.spec.kv_layout import Group, Window
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters.sglang import SglangRadixCache, sglang

WINDOW = 3  # SGLang's `sliding_window_size` for the adapters below: 3 positions behind each query
CALLS = 64  # past the most calls a harness program makes (each decode grows a sequence by one)


@functools.cache
def swa() -> Any:
    """SGLang's all-SWA cache, allocator, KV pool and the SWA component's name, imported once."""
    from sglang.srt.mem_cache.allocator.swa import PureSWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    return PureSWARadixCache, PureSWATokenToKVPoolAllocator, SWAKVPool, ComponentType.SWA


def swa_kv_pool(size: int, size_swa: int, *, full_layers: bool) -> Any:
    """SGLang's `SWAKVPool` on the CPU: `size` full slots and `size_swa` SWA slots of a tiny layer
    each, a sliding-window layer and (with `full_layers`) a full-attention one."""
    pool_class = swa()[2]
    return pool_class(
        size=size,
        size_swa=size_swa,
        page_size=1,
        dtype=sglang().torch.float16,
        head_num=1,
        head_dim=4,
        swa_attention_layer_ids=[1] if full_layers else [0],
        full_attention_layer_ids=[0] if full_layers else [],
        device="cpu",
    )


class SglangWindowCache(SglangRadixCache):
    """SGLang's `PureSWARadixCache` over its all-SWA allocator: `pages` pages of one token (page 0
    the dummy), a sliding window of `window` positions behind each query."""

    capabilities = frozenset({"atomic", "reset_cache", "single_owner", "tenants", "groups"})
    publishes_decodes = False

    def __init__(self, pages: int, page_size: int, *, window: int = WINDOW, prefill_aware: bool = False) -> None:
        if page_size != 1:
            raise ValueError(f"SGLang's all-SWA allocator has pages of 1 token, not {page_size}: run with page size 1")
        cache_class, allocator_class, _, self.component = swa()
        kv = swa_kv_pool(pages - 1, pages - 1, full_layers=False)
        self.window, self.prefill_aware = window, prefill_aware
        self.groups: tuple[Group, ...] = (Window(window + 1),)
        super().__init__(
            pages,
            page_size,
            paged=False,
            cache_class=cache_class,
            allocator_class=lambda size, dtype, device, _kv, need_sort: allocator_class(
                size, 1, dtype, device, kv, need_sort
            ),
            sliding_window_size=window,
            max_context=pages + CALLS,  # a window's sequence outgrows the pool: the harness's calls bound it
        )
        self.slid: dict[int, range] = {}  # request -> the positions its window slides freed

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        found = super().admit(request_id, tokens)
        if found is not None and self.prefill_aware:
            self.requests[request_id].kv.swa_evict_floor = len(tokens)
        return found

    def append(self, request_id: int, token: int) -> bool:
        if not self._room(1):  # `check_decode_mem` first: a decode short of room is retracted
            return False
        if self.decoded[request_id] >= 1:  # maybe_evict_swa: the window slides before the decode
            self._slide(request_id)
        if not super().append(request_id, token):
            raise RuntimeError("SGLang refused a decode slot that check_decode_mem found room for")
        return True

    def _slide(self, request_id: int, computed: int | None = None) -> None:
        """`evict_sliding_windows` at the request's computed length (`computed`, or all its
        tokens): SGLang frees its own slots from its SWA cursor, raised first to what it may free
        (`swa_dead_lo`: past the tree's part and the prefill floor), up to the window; the positions
        freed are remembered for the view."""
        request = self.requests[request_id]
        kv = request.kv
        start = max(kv.get_evicted_seqlen(self.component), kv.swa_dead_lo(self.page_size))
        self.tree.evict_sliding_windows(request, len(request) if computed is None else computed)
        end = kv.get_evicted_seqlen(self.component)
        if end > start:
            before = self.slid.get(request_id, range(start, start))
            self.slid[request_id] = range(min(before.start, start), end)

    def free(self, request_id: int) -> None:
        super().free(request_id)
        self.slid.pop(request_id, None)

    def free_pages(self, allocator: Any) -> frozenset[int]:
        return super().free_pages(allocator.swa_attn_allocator)  # its one pool

    def request_tables(self) -> dict[int, tuple[int, ...]]:
        """The rows, the positions a window slide freed shown as the dummy page 0 (a row keeps a
        freed slot's id, which the allocator may hand out again)."""
        tables = super().request_tables()
        for request_id, slid in self.slid.items():
            tables[request_id] = tuple(0 if index in slid else page for index, page in enumerate(tables[request_id]))
        return tables

    def view(self) -> PoolView:
        whole = super().view()
        return replace(
            whole, tables={}, group_tables={request_id: (table,) for request_id, table in whole.tables.items()}
        )


def pure_swa_prefill_aware(pages: int, page_size: int) -> SglangWindowCache:
    """SGLang's `PureSWARadixCache` (a window of 3 positions behind each query, page size 1) for a
    prefill-aware model (`prefill_aware_swa`, as SGLang's one all-SWA target model in 0.5.23,
    UnlimitedOCR, is): the prompt never slides out, and a release caches the prompt only."""
    return SglangWindowCache(pages, page_size, prefill_aware=True)


def pure_swa(pages: int, page_size: int) -> SglangWindowCache:
    """`pure_swa_prefill_aware` for a model that is not prefill-aware: it fails the harness
    (`devtools.sglang.variants.FOUND`: a release caches slots its window slides freed)."""
    return SglangWindowCache(pages, page_size)
