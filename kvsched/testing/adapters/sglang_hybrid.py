"""SGLang's hybrid radix cache for models with full-attention and sliding-window layers behind the
adapter protocol (`sglang` 0.5.23), with "groups": `Full()` and `Window(W)`.

A model with both kinds of layer (gpt-oss, Gemma 3) runs on SGLang's `UnifiedRadixCache` with its
full and SWA components (`ComponentType.FULL`, `ComponentType.SWA`; the Python tree core, whose
nodes the view reads) over `SWATokenToKVPoolAllocator`: **a pool per kind**, a full pool and an SWA
pool, page size 1, slot 0 the dummy of each. A request's row holds its full slots; the allocator
maps each full slot to the SWA slot holding the same position's window KV
(`full_to_swa_index_mapping`, 0 for none). A tree node holds full slots and, unless it is a
tombstone (its window KV evicted or slid away), SWA slots: a prefix hit needs full KV everywhere and
window KV only where the next query reads.

The adapter drives them as `kvsched.testing.adapters.sglang_window` drives the all-SWA cache (a
decode that has room slides the window first, `evict_sliding_windows`; a request publishes after
its prefill, and the rest at release), and as the scheduler does for two pools: an admission or a
decode makes room in both (`evict_to_free_tokens`: the tree evicts full nodes, or only their window
KV, for whichever pool is short), and is refused when the free and evictable slots of either pool
fall short.

The view puts both pools in the harness's `pages` ids: the full pool's slots are ids 0 .. F - 1,
the SWA pool's slot s is id F + s, with F = pages - max(2, 3 * pages // 8) (an SWA pool smaller
than the full one, as SGLang sizes it, so that either pool may be the one short); ids 0 and F (the
dummies) are reserved. A request's full table is its row; its window table is the row's SWA
slots, the null page 0 where a position has none (slid out of the window, or a hit's position
the tree keeps as a tombstone). A tree page's key names its component: (salt, tokens) for full
KV, ("swa", salt, tokens) for window KV. A full tree page's holders are its node's lock count, as
in `sglang`. A window page's holders are the window tables that hold it: SGLang locks a hit's
window, not every position a row maps, and whether the tree takes a page a window still reads is
what the read check (GHOST) sees, the slot then free or another's and the mapping cleared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from kvsched.spec.kv_layout import Full, Group, Window
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters.sglang import SglangRadixCache
from kvsched.testing.adapters.sglang_window import CALLS, SglangWindowCache, swa_kv_pool

SWA_KEY = "swa"  # a window page's key: (SWA_KEY, salt, tokens)
HYBRID_WINDOW = 2  # positions behind each query: windows slide within the small pools the harness draws


@functools.cache
def hybrid() -> Any:
    """SGLang's two-pool allocator and the SWA component's name, imported once."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    return SWATokenToKVPoolAllocator, ComponentType.SWA


class SglangHybridCache(SglangWindowCache):
    """SGLang's `UnifiedRadixCache` (full and SWA components) over `SWATokenToKVPoolAllocator`: the
    harness's `pages` ids cut into a full pool and an SWA pool (the module docstring), a sliding
    window of `window` positions behind each query."""

    capabilities = frozenset({"atomic", "reset_cache", "single_owner", "tenants", "groups"})

    def __init__(
        self,
        pages: int,
        page_size: int,
        *,
        window: int = HYBRID_WINDOW,
        components: tuple[str, ...] = ("FULL", "SWA"),
        rows_class: Callable[..., Any] | None = None,
    ) -> None:
        if page_size != 1:
            raise ValueError(f"SGLang's SWA allocator runs here with pages of 1 token, not {page_size}: page size 1")
        if pages < 4:
            raise ValueError(f"{pages} pages: two pools, each with its dummy, need at least 4")
        allocator_class, self.component = hybrid()
        self.all_pages, self.swa_base = pages, pages - max(2, pages * 3 // 8)
        swa_slots = pages - self.swa_base - 1
        kv = swa_kv_pool(self.swa_base - 1, swa_slots, full_layers=True)
        self.window, self.prefill_aware = window, False
        self.groups: tuple[Group, ...] = (Full(), Window(window + 1))
        SglangRadixCache.__init__(
            self,
            self.swa_base,
            1,
            paged=False,
            tree_core="python",
            components=components,
            rows_class=rows_class,
            allocator_class=lambda size, dtype, device, _kv, need_sort: allocator_class(
                size, swa_slots, 1, dtype, device, kv, need_sort
            ),
            sliding_window_size=window,
            max_context=pages + CALLS,
        )
        self.slid: dict[int, range] = {}

    # -- room in both pools ---------------------------------------------------------------------

    def _room(self, need: int) -> bool:
        allocator, tree = self.allocator, self.tree
        return need <= int(allocator.full_available_size()) + int(tree.full_evictable_size()) and need <= int(
            allocator.swa_available_size()
        ) + int(tree.swa_evictable_size())

    def _evict_for(self, need: int) -> None:
        self.allocator.evict_to_free_tokens(self.tree, need)  # the scheduler's `evict_from_tree_cache`

    # -- the view -------------------------------------------------------------------------------

    def free_pages(self, allocator: Any) -> frozenset[int]:
        full = SglangRadixCache.free_pages(self, allocator.full_attn_allocator)
        window = SglangRadixCache.free_pages(self, allocator.swa_attn_allocator)
        return full | frozenset(self.swa_base + slot for slot in window)

    def group_tables(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Each live request's full table (its row) and window table (its row's SWA slots, 0 for none)."""
        mapping = self.allocator.full_to_swa_index_mapping
        tables: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for request_id, request in self.requests.items():
            row = self.rows.req_to_token[request.kv.req_pool_idx, : len(request)].to(self.torch.int64)
            window = tuple(self.swa_base + slot if slot > 0 else 0 for slot in mapping[row].tolist())
            tables[request_id] = (tuple(row.tolist()), window)
        return tables

    def window_pages(self) -> dict[int, tuple[object, int]]:
        """Each window page the tree holds (its node not a tombstone): its key and its node's SWA lock count."""
        swa = self.component
        pages = self._nodes(
            self.tree.tree_core.root_node,
            lambda node: node.component_data[swa].value,
            lambda node: node.component_data[swa].lock_ref,
        )
        return {
            self.swa_base + slot: ((SWA_KEY, *cast(tuple[object, ...], key)), locks)
            for slot, (key, locks) in pages.items()
        }

    def view(self) -> PoolView:
        tables = self.group_tables()
        full, window = self.tree_pages(), self.window_pages()
        in_tables = [0] * self.all_pages
        for table in tables.values():
            for page in (*table[0], *table[1]):
                if 0 <= page < self.all_pages:
                    in_tables[page] += 1
        holders = list(in_tables)  # private pages and window pages: the tables that hold them
        for page, (_, locks) in full.items():
            holders[page] = locks
        for reserved in (0, self.swa_base):
            holders[reserved] = 0
        evictable = {page for page, (_, locks) in full.items() if locks == 0}
        evictable |= {page for page, (_, locks) in window.items() if locks == 0 and not in_tables[page]}
        return PoolView(
            holders=tuple(holders),
            free=self.free_pages(self.allocator),
            tables={},
            cached={page: key for page, (key, _) in (*full.items(), *window.items())},
            reserved=frozenset({0, self.swa_base}),
            evictable=frozenset(evictable),
            group_tables=tables,
        )


def hybrid_swa(pages: int, page_size: int) -> SglangHybridCache:
    """SGLang's `UnifiedRadixCache` with full and SWA components over its two pools (the SWA pool
    about 3/8 of the ids, page size 1), a window of 2 positions behind each query: the cache SGLang
    runs a model with full and sliding-window layers on."""
    return SglangHybridCache(pages, page_size)
