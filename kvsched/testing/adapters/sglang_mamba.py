"""SGLang's hybrid radix cache for models with full-attention and Mamba (or GDN, linear attention)
layers behind the adapter protocol (`sglang` 0.5.23), with "groups": `Full()` and `Recurrent()`.

A model like Qwen3-Next or Nemotron-H runs on SGLang's `UnifiedRadixCache` with its full and Mamba
components (`ComponentType.FULL`, `ComponentType.MAMBA`; the Python tree core, whose nodes the view
reads) over a `HybridReqToTokenPool`: a request row as before, and a Mamba pool of state slots
(`MambaSlotAllocator`, slot 0 its dummy) beside the token pool. Without SGLang's extra buffer (its
default here), a state is cached only where a request's computed tokens end: a tree node keeps a
state slot (a snapshot) for its whole path, or none.

The adapter drives them as `kvsched.testing.adapters.sglang` drives the radix cache, and adds what
the scheduler adds for such a model:

- admit: `match_prefix` with `cow_mamba` (`init_next_round_input`): a hit whose last node holds a
  snapshot takes a state slot for the request and names the snapshot to copy into it before the
  pass (`mamba_cow_src_index`, a state copy the harness makes); a request that cannot then be
  admitted gives that slot back, as the scheduler does when `add_one_req` refuses it. A request
  without a hit gets a fresh slot with its row (`HybridReqToTokenPool.alloc`). The adapter admits
  a request only when two state slots are free or held by evictable snapshots (its own and its
  checkpoint's): SGLang asserts when its match or its checkpoint finds none, which its pool
  sizing keeps from happening. The match may evict a snapshot to find the slot
  (`evict_for_alloc`), so a refused admission is not atomic, and the adapter does not declare
  "atomic".
- written: after the prefill (not after a decode), `checkpoint` publishes the prompt: SGLang
  copies the request's state into a slot of the tree's (`MambaPool.copy_from`: the adapter
  records the copies SGLang's pool makes, and the harness makes them at once).
- free: the request is finished, so `checkpoint` hands its state slot to the tree as the snapshot
  of all its tokens (no copy), or frees it when the tree already has one there.

Its "sequence end" is every computed token (`_mamba_cache_chunk_size` is 1: a snapshot may end
anywhere). The view's state slots are SGLang's less its dummy: view slot s is SGLang's slot s + 1.
A snapshot's key is its node's salt and tokens through the node's end. `SglangSwaMambaCache` adds
the SWA component and its pool (`kvsched.testing.adapters.sglang_hybrid`): all three kinds in one
tree.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvsched.spec.kv_layout import Full, Group, Recurrent, Window
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters.sglang import Request, SglangRadixCache
from kvsched.testing.adapters.sglang_hybrid import HYBRID_WINDOW, SglangHybridCache

Copy = tuple[int, int]


@functools.cache
def mamba() -> Any:
    """SGLang's Mamba pools, its state shapes and the server arguments its Mamba component reads
    (a dummy model's, snapshots at any length), published once for this process."""
    import types

    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    server_args = ServerArgs(model_path="dummy", page_size=1)
    server_args._mamba_cache_chunk_size = 1  # a dummy model has no HF config to read it from
    set_global_server_args_for_scheduler(server_args)
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=2, n_groups=1, num_heads=1, head_dim=1, state_size=1, conv_kernel=2
    )
    return types.SimpleNamespace(
        params=Mamba2CacheParams(shape=shape, layers=[1]),
        HybridReqToTokenPool=HybridReqToTokenPool,
        MAMBA=ComponentType.MAMBA,
    )


class SglangMambaCache(SglangRadixCache):
    """SGLang's `UnifiedRadixCache` (full and Mamba components) over a token allocator of `pages`
    pages of one token (page 0 the dummy) and `states` Mamba state slots (its dummy apart)."""

    capabilities = frozenset({"reset_cache", "single_owner", "tenants", "groups"})
    publishes_decodes = False

    def __init__(self, pages: int, page_size: int, *, states: int | None = None) -> None:
        if page_size != 1:
            raise ValueError(f"SGLang's Mamba cache without its extra buffer needs pages of 1 token, not {page_size}")
        self.groups: tuple[Group, ...] = (Full(), Recurrent())
        self.states = pages if states is None else states
        super().__init__(
            pages, 1, paged=False, tree_core="python", components=("FULL", "MAMBA"), rows_class=self.state_rows
        )
        self.record_state_copies()

    def state_rows(self, size: int, max_context_len: int, device: str, enable_memory_saver: bool) -> Any:
        """SGLang's request rows with `self.states` Mamba state slots beside them."""
        parts = mamba()
        return parts.HybridReqToTokenPool(
            size=size,
            mamba_size=self.states,
            mamba_spec_state_size=0,
            max_context_len=max_context_len,
            device=device,
            enable_memory_saver=enable_memory_saver,
            cache_params=parts.params,
            mamba_layer_ids=[1],
            enable_mamba_extra_buffer=False,
            enable_overlap_schedule=False,
        )

    def record_state_copies(self) -> None:
        """Record the state copies SGLang's Mamba pool makes (`copy_from`), as the harness's."""
        self.copied: tuple[list[Copy], list[Copy]] = ([], [])
        self.pool_copies: list[Copy] = []  # the state copies SGLang's cache itself made, in order
        pool = self.rows.mamba_pool
        copy_from = pool.copy_from

        def recorded(src_indices: Any, dst_indices: Any) -> Any:
            pairs = zip(src_indices.view(-1).tolist(), dst_indices.view(-1).tolist(), strict=True)
            self.pool_copies += [(self._slot(source), self._slot(destination)) for source, destination in pairs]
            return copy_from(src_indices, dst_indices)

        pool.copy_from = recorded

    def state_copies(self) -> tuple[list[Copy], list[Copy]]:
        return self.copied

    @property
    def mamba_component(self) -> Any:
        return mamba().MAMBA

    def _slot(self, index: Any) -> int:
        """The view's state slot of SGLang's slot `index` (a tensor or an int)."""
        return int(index) - 1

    # -- the scheduler's calls ----------------------------------------------------------------

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        self.copied = ([], [])
        found = super().admit(request_id, tokens)
        if found is None:
            return None
        kv = self.requests[request_id].kv
        if kv.mamba_cow_src_index is not None:  # the model runner copies the snapshot in before the pass
            self.copied = ([(self._slot(kv.mamba_cow_src_index), self._slot(kv.mamba_pool_idx))], [])
            kv.mamba_cow_src_index = None
        return found

    def _match(self, request: Request, key: Any) -> Any:
        """The match with copy-on-write, when two state slots are free or evictable (the request's
        own, which a hit's copy-on-write takes at once, and its checkpoint's); without them, a match
        that copies nothing (the claim refuses the request)."""
        room = self.rows.mamba_allocator.available_size() + self.tree.mamba_evictable_size() >= 2
        return self.tree.match_prefix(self.m.MatchPrefixParams(key=key, cow_mamba=room, req=request))

    def _claim(self, node: Any, need: int, request: Request) -> Any:
        """The radix cache's claim, then the state slots the request needs, free or held by
        snapshots the tree may evict: its own (unless its match gave it one) and the one its
        prefill's checkpoint copies into (refused when they are not there); its own taken."""
        lock = super()._claim(node, need, request)
        if lock is None:
            return None
        own = not request.kv.holds_mamba
        slots = self.rows.mamba_allocator.available_size()
        if slots + self.tree.mamba_evictable_size() < own + 1:
            self.tree.unlock(lock)
            return None
        if own and not slots:
            self.tree.evict_for_alloc(self.m.EvictParams(num_tokens=0, mamba_num=1))
        return lock

    def _refused(self, request: Request) -> None:
        """`add_one_req` refused the request: the state slot its match took goes back."""
        if request.kv.holds_mamba:
            self.rows.mamba_allocator.free(request.kv.mamba_pool_idx.unsqueeze(-1))
            request.kv.mamba_pool_idx = None
        request.kv.mamba_cow_src_index = None

    def append(self, request_id: int, token: int) -> bool:
        self.copied = ([], [])
        return super().append(request_id, token)

    def written(self, request_id: int, tokens: int) -> None:
        self.pool_copies = []
        super().written(request_id, tokens)  # a prefill's checkpoint copies the state the pass left
        self.copied = ([], self.pool_copies)

    def free(self, request_id: int) -> None:
        self.requests[request_id].done = True  # a release checkpoints a finished request
        super().free(request_id)

    # -- the view -----------------------------------------------------------------------------

    def _snapshot_slots(self) -> dict[int, object]:
        """Each state slot the tree holds as a snapshot, with its key: the state after every token
        of its node's path."""
        found: dict[int, object] = {}
        stack: list[tuple[Any, tuple[int, ...]]] = [(self.tree.tree_core.root_node, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                tokens: tuple[int, ...] = path + tuple(child.key)
                stack.append((child, tokens))
                value = child.component_data[self.mamba_component].value
                if value is not None:
                    found[self._slot(value[0])] = (child.key.extra_key, tokens)
        return found

    def view(self) -> PoolView:
        whole = super().view()
        tables = whole.group_tables or {request_id: (table,) for request_id, table in whole.tables.items()}
        return replace(
            whole,
            tables={},
            group_tables={request_id: (*attention, ()) for request_id, attention in tables.items()},
            state_slots=self.states,
            states={
                request_id: (self._slot(request.kv.mamba_pool_idx),) for request_id, request in self.requests.items()
            },
            snapshots=self._snapshot_slots(),
            state_free=frozenset(self._slot(slot) for slot in self.rows.mamba_allocator.free_slots.tolist()),
        )


def hybrid_mamba(pages: int, page_size: int) -> SglangMambaCache:
    """SGLang's `UnifiedRadixCache` with full and Mamba components: a token pool of `pages` pages
    of one token and as many Mamba state slots (so that snapshots are evicted for slots)."""
    return SglangMambaCache(pages, page_size)


class SglangSwaMambaCache(SglangMambaCache, SglangHybridCache):
    """SGLang's `UnifiedRadixCache` with full, SWA and Mamba components (a model with all three
    kinds of layer): the hybrid SWA cache's two pools (`sglang_hybrid`) and the Mamba cache's
    state slots, as many as the token ids."""

    def __init__(self, pages: int, page_size: int) -> None:
        self.states = pages
        SglangHybridCache.__init__(
            self, pages, page_size, components=("FULL", "SWA", "MAMBA"), rows_class=self.state_rows
        )
        self.groups = (Full(), Window(HYBRID_WINDOW + 1), Recurrent())
        self.record_state_copies()


def hybrid_swa_mamba(pages: int, page_size: int) -> SglangMambaCache:
    """SGLang's `UnifiedRadixCache` with full, SWA and Mamba components over two token pools and
    Mamba state slots."""
    return SglangSwaMambaCache(pages, page_size)
