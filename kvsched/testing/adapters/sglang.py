"""SGLang's radix cache and token allocators behind the adapter protocol (`sglang` 0.5.23).

SGLang owns a page once: its allocator's free list, a radix tree node, or one request's private
tail (`kvsched.testing.adapter`, capability "single_owner"). The adapter drives SGLang's own
classes (`RadixCache`, `TokenToKVPoolAllocator` or `PagedTokenToKVPoolAllocator`,
`ReqToTokenPool`, the request's `ReqKvInfo`) the way its scheduler does:

- admit: match the prompt's prefix capped before its last token (`RadixKey(limit=n - 1)`: the
  last token's logits are computed), lock the matched node, then check that the free slots and
  the tree's evictable ones cover the new tokens (a refusal unlocks and changes nothing), evict
  what is short, allocate (`alloc` for page size 1, `alloc_extend` paged) and write the row;
- append: a new slot (`alloc`, or `alloc_decode`, which takes a page only at a page boundary),
  evicting first when short, refusing when even eviction cannot cover it;
- written: once the forward pass has written every token the request has, `checkpoint` publishes
  its whole pages (SGLang's insert frees the request's copies of pages the tree already had and
  repoints its row at the tree's);
- free: `release_kv_cache`'s steps (checkpoint, free the row past the tree's part, unlock, give
  the row back; the function itself reads the server's global config, which a bare cache has not);
- reset_cache: the scheduler's `flush_cache`, only when no request is live.

Each request's tenant (`kvsched.testing.adapter.tenant_of`, capability "tenants") is its
`RadixKey.extra_key`, SGLang's namespace for the tree: the harness checks no tenant reads
another's KV.

SGLang's `Req` belongs to its scheduler (sampling, grammar, server config); the adapter keeps a
record with the fields the cache reads, under SGLang's names. The view derives a tree page's
holders from its node's `lock_ref` and a private page's from the one table it is in; a page's
cache key is its salt and every token up to its end. Slot 0 (page 0) is SGLang's dummy.

`radix_token` needs the harness's page size 1 (the token allocator's page); `radix_paged` takes
any. The broken variants are in `devtools/sglang/variants.py`.
"""

from __future__ import annotations

import functools
import types
import warnings
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from kvsched.integrations.vllm.events import translate
from kvsched.spec.kv_events import KvEvent
from kvsched.testing.adapter import PoolView, tenant_of

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")


@functools.cache
def sglang_events() -> Any:
    """SGLang's KV event hashing (`sglang.srt.mem_cache.events`), imported once."""
    import importlib

    return importlib.import_module("sglang.srt.mem_cache.events")


@functools.cache
def sglang() -> Any:
    """SGLang's cache modules, imported once (about 10 s: `radix_cache` loads torch and much of
    SGLang), or ImportError naming what to install."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SGLang warns at import about kernels the CPU lacks
            import torch
            from sglang.srt.managers.schedule_batch import ReqKvInfo
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    except ImportError as error:
        raise ImportError(f"SGLang is not installed ({error}): make sglang builds its venv") from error

    return types.SimpleNamespace(
        torch=torch,
        ReqKvInfo=ReqKvInfo,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        EvictParams=EvictParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        ReqToTokenPool=ReqToTokenPool,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        ComponentType=ComponentType,
        UnifiedRadixCache=UnifiedRadixCache,
    )


class Request:
    """What SGLang's cache reads of a `Req`, under SGLang's names."""

    def __init__(self, request_id: int, tokens: Sequence[int], salt: str | None) -> None:  # salt: extra_key
        self.rid = str(request_id)
        self.origin_input_ids = array("q", tokens)
        self.output_ids = array("q")
        self.extra_key = salt
        self.cache_salt: str | None = None
        self.kv: Any = sglang().ReqKvInfo()
        self.priority: int | None = None
        self.lock: Any = None
        self.last_node: Any = None
        self.skip_radix_cache_insert = False
        self.session: Any = None  # not a streaming session (UnifiedRadixCache asks)
        self.session_id: str | None = None
        self.kv_rotation_base: int | None = None  # no page sharding across ranks
        self.swa_branching_seqlen: int | None = None  # where a hybrid SWA tree inserts its window (its match says)
        self.done = False  # finished: a Mamba tree takes its state at release

    @property
    def full_untruncated_fill_ids(self) -> array[int]:
        return self.origin_input_ids + self.output_ids

    def get_fill_ids(self) -> array[int]:  # every token is computed when the cache reads it
        return self.full_untruncated_fill_ids

    def __len__(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.done


class SglangRadixCache:
    """SGLang's `RadixCache` (or `cache_class`) over its token allocator (`paged=False`, page size
    1) or its paged one, `pages` pages of `page_size` tokens, page 0 the dummy."""

    capabilities = frozenset({"atomic", "reset_cache", "single_owner", "tenants"})
    publishes_decodes = True  # `written` publishes after every pass; False: after the prefill only

    def __init__(
        self,
        pages: int,
        page_size: int,
        *,
        paged: bool,
        policy: str = "lru",
        salted: bool = True,
        tree_core: str | None = None,
        cache_class: type | None = None,
        allocator_class: Callable[..., Any] | None = None,
        events: bool = False,
        sliding_window_size: int | None = None,
        max_context: int | None = None,
        components: tuple[str, ...] = ("FULL",),
        rows_class: Callable[..., Any] | None = None,
    ) -> None:
        m = sglang()
        if not paged and page_size != 1:
            raise ValueError(
                f"SGLang's TokenToKVPoolAllocator has pages of 1 token, not {page_size}: run with page size 1"
            )
        if pages < 2:
            raise ValueError(f"{pages} pages: SGLang's page 0 is its dummy, so at least 2")
        self.pages, self.page_size, self.paged, self.salted = pages, page_size, paged, salted
        slots = (pages - 1) * page_size  # pages 1 .. pages - 1 (SGLang's free list starts at 1)
        if paged:
            allocator = allocator_class or m.PagedTokenToKVPoolAllocator
            self.allocator = allocator(slots, page_size, m.torch.float16, "cpu", None, False)
        else:
            allocator = allocator_class or m.TokenToKVPoolAllocator
            self.allocator = allocator(slots, m.torch.float16, "cpu", None, False)
        self.rows = (rows_class or m.ReqToTokenPool)(
            size=pages,
            max_context_len=max_context or pages * page_size + 1,
            device="cpu",
            enable_memory_saver=False,
        )
        unified: dict[str, Any] = {}
        if tree_core is not None:  # UnifiedRadixCache over this tree core, with these components
            unified = {
                "tree_components": tuple(m.ComponentType[name] for name in components),
                "tree_core_backend": tree_core,
            }
        params = m.CacheInitParams(
            disable=False,
            req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page_size,
            eviction_policy=policy,
            enable_kv_cache_events=events,
            sliding_window_size=sliding_window_size,
            **unified,
        )
        self.tree = (cache_class or (m.RadixCache if tree_core is None else m.UnifiedRadixCache))(params)
        if tree_core is not None and self.tree._tree_core_backend != tree_core:
            raise ValueError(f"SGLang's {tree_core} tree core does not load here ({self.tree._tree_core_backend} did)")
        if tree_core == "rust":  # its walk shows slot chains, not the tokens: keys name where a page sits
            self.capabilities = type(self).capabilities | {"location_keys"}
        self.requests: dict[int, Request] = {}
        self.decoded: dict[int, int] = {}  # request -> its decodes so far (SGLang's decode_batch_idx)
        self.event_keys: dict[int, object] = {}  # an event's block hash -> the view's key of its page
        if events:
            if tree_core is not None:
                raise ValueError("KV events are read from RadixCache's own nodes: not with a tree core")
            self.capabilities = type(self).capabilities | {"events"}

    @property
    def m(self) -> Any:
        return sglang()

    @property
    def torch(self) -> Any:
        return sglang().torch

    # -- the scheduler's calls ----------------------------------------------------------------

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        m, tree, size = self.m, self.tree, self.page_size
        salt = f"tenant-{tenant_of(request_id)}" if self.salted else None  # the tree's namespace
        request = Request(request_id, tokens, salt)
        n = len(tokens)
        key = m.RadixKey(request.origin_input_ids, request.extra_key, limit=n - 1)
        match = self._match(request, key)
        prefix, node = int(match.device_prefix_len), match.last_device_node
        request.swa_branching_seqlen = match.swa_branching_seqlen  # as `match_kv_cache` keeps it
        lock = self._claim(node, (-(-n // size) - prefix // size) * size, request)
        if lock is None:
            self._refused(request)
            return None
        prefix_slots = tree.path_device_indices(node)[:prefix]
        self.rows.alloc([request])
        row = request.kv.req_pool_idx
        if self.paged:
            last = int(prefix_slots[-1]) if prefix else -1
            lengths = self.torch.tensor([prefix]), self.torch.tensor([n])
            new = self.allocator.alloc_extend(
                lengths[0], lengths[0], lengths[1], lengths[1], self.torch.tensor([last]), n - prefix
            )
        else:
            new = self.allocator.alloc(n - prefix)
        if new is None:
            raise RuntimeError(f"SGLang's allocator refused {n - prefix} slots after the tree evicted for them")
        self.rows.write((row, slice(0, prefix)), prefix_slots.to(self.torch.int32))
        self.rows.write((row, slice(prefix, n)), new.to(self.torch.int32))
        request.kv.cache_protected_len = prefix
        request.kv.kv_allocated_len = request.kv.kv_committed_len = n
        request.lock, request.last_node = lock, node
        self.requests[request_id] = request
        self.decoded[request_id] = 0
        return prefix

    def _match(self, request: Request, key: Any) -> Any:
        """The tree's match for the request's prompt (`key`, capped before its last token)."""
        return self.tree.match_prefix(self.m.MatchPrefixParams(key=key))

    def _refused(self, request: Request) -> None:
        """The admission was refused after its match: what the match took for the request goes back."""

    def _claim(self, node: Any, need: int, request: Request) -> Any:
        """Lock the matched node, then make `need` slots free for `request` (evicting what is
        short); None, the lock undone, when even eviction cannot (a request row is needed too)."""
        lock = self.tree.lock(node)  # first: eviction must not take the matched pages
        if not self._room(need) or not self.rows.available_size():
            self.tree.unlock(lock)
            return None
        self._evict_for(need)
        return lock

    def append(self, request_id: int, token: int) -> bool:
        request = self.requests[request_id]
        position = len(request)
        need = self.page_size if position % self.page_size == 0 else 0  # a new page at a boundary
        if not self._room(need):
            return False
        self._evict_for(need)
        row = self.rows.req_to_token[request.kv.req_pool_idx]
        if self.paged:
            length = self.torch.tensor([position + 1])
            slot = self.allocator.alloc_decode(length, length, row[position - 1 : position].to(self.torch.int64))
        else:
            slot = self.allocator.alloc(1)
        if slot is None:
            raise RuntimeError(f"SGLang's allocator refused a decode slot after evicting to {need} free")
        self.rows.write((request.kv.req_pool_idx, position), int(slot[0]))
        request.output_ids.append(token)
        request.kv.kv_allocated_len = request.kv.kv_committed_len = position + 1
        self.decoded[request_id] += 1
        return True

    def written(self, request_id: int, tokens: int) -> None:
        if not self.publishes_decodes and self.decoded[request_id]:
            return  # SGLang's scheduler publishes after an extend (prefill), not a decode
        request = self.requests[request_id]
        whole = tokens // self.page_size * self.page_size
        if tokens == len(request) and whole > request.kv.cache_protected_len:
            self.tree.checkpoint(request, up_to=tokens)  # after the forward pass: publish

    def free(self, request_id: int) -> None:
        request = self.requests.pop(request_id)
        del self.decoded[request_id]
        owned = request.kv.kv_committed_len
        self.tree.checkpoint(request, up_to=owned)
        self.tree.free_kv_row(request.kv, [(request.kv.cache_protected_len, owned)])
        self.tree.unlock(request.lock)
        request.lock = None
        self.rows.free(request)
        request.kv.mark_kv_released()

    def reset_cache(self) -> bool:
        if self.requests:  # the scheduler flushes only when idle
            return False
        self.tree.reset()
        self.rows.clear()
        self.allocator.clear()
        return True

    def _room(self, need: int) -> bool:
        return need <= int(self.allocator.available_size()) + int(self.tree.evictable_size())

    def _evict_for(self, need: int) -> None:
        short = need - self.allocator.available_size()
        if short > 0:
            self.tree.evict(self.m.EvictParams(num_tokens=short))

    # -- the KV events ("events") --------------------------------------------------------------

    def events(self) -> list[KvEvent]:
        """SGLang's KV events since the last call, each block hash named as the view names its
        page (learned from the pages the tree holds now and before; a hash never seen on a page,
        stored and dropped within one call, stays as it is)."""
        self._learn_event_keys()
        return translate(self.tree.take_events(), lambda block_hash, _: self.event_keys.get(block_hash, block_hash))

    def _learn_event_keys(self) -> None:
        """The event hash of every page the tree holds, as SGLang's recorder computes it."""
        recorder, published = self.tree.kv_events, sglang_events()
        stack: list[tuple[Any, tuple[int, ...]]] = [(self.tree.root_node, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                tokens: tuple[int, ...] = path + tuple(child.key)
                values, seed = recorder._node_event_hash_values(child), recorder._namespace_seed(child)
                for index, start in enumerate(range(0, len(child.key), self.page_size)):
                    event_hash = published.namespaced_block_hash(
                        published.hash_str_to_int64(values[index]), namespace_seed=seed
                    )
                    self.event_keys[event_hash] = (child.key.extra_key, tokens[: len(path) + start + self.page_size])
                stack.append((child, tokens))

    # -- the view -----------------------------------------------------------------------------

    def _page(self, slot: int) -> int:
        return slot // self.page_size

    def tree_pages(self) -> dict[int, tuple[object, int]]:
        """Each page the tree holds: (its key, its node's lock count). A key is the page's salt
        and every token up to its end; under the Rust tree core, which shows no nodes, the chain of
        slots from the root to the page, and a lock count of 1 for a locked page (see `_walked`)."""
        core = getattr(self.tree, "tree_core", None)
        if core is None:  # RadixCache: its nodes carry their slots and lock count
            return self._nodes(self.tree.root_node, lambda node: node.value, lambda node: node.lock_ref)
        if self.tree._tree_core_backend == "python":
            full = self.m.ComponentType.FULL
            return self._nodes(
                core.root_node,
                lambda node: node.component_data[full].value,
                lambda node: node.component_data[full].lock_ref,
            )
        return self._walked(core)

    def _nodes(self, root: Any, slots_of: Any, locks_of: Any) -> dict[int, tuple[object, int]]:
        """Each page the tree under `root` holds (`slots_of` a node: its slots, or None where the
        node holds none, a hybrid tree's tombstone), with its key and its node's `locks_of`."""
        found: dict[int, tuple[object, int]] = {}
        stack: list[tuple[Any, tuple[int, ...]]] = [(root, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                tokens: tuple[int, ...] = path + tuple(child.key)
                stack.append((child, tokens))
                value = slots_of(child)
                if value is None:
                    continue
                slots = value.tolist()
                for start in range(0, len(slots), self.page_size):
                    end = len(path) + start + self.page_size
                    found[self._page(slots[start])] = ((child.key.extra_key, tokens[:end]), int(locks_of(child)))
        return found

    def _walked(self, core: Any) -> dict[int, tuple[object, int]]:
        """The Rust tree core's slots, from its KV-canary walk (each slot, the slot before it on
        its path): a page's key is its slot chain back to the root; its lock count is 0 when the
        unlocked-only walk lists it, else 1 (the view then checks locked exactly when held)."""
        walk = core.walk_for_kv_canary(False, False)
        before = dict(zip(walk.slot_indices.tolist(), walk.prev_slot_indices.tolist(), strict=True))
        unlocked = set(core.walk_for_kv_canary(True, False).slot_indices.tolist())
        found: dict[int, tuple[object, int]] = {}
        for slot in before:
            if slot % self.page_size:
                continue  # a page is named by its first slot
            chain, link = [slot], before[slot]
            while link >= 0:
                chain.append(link)
                link = before.get(link, -1)
            found[self._page(slot)] = (tuple(reversed(chain)), 0 if slot in unlocked else 1)
        return found

    def free_pages(self, allocator: Any) -> frozenset[int]:
        """The pages `allocator` would hand out next: its free list holds page ids (slots, at page size 1)."""
        released = allocator.get_all_free_pages() if self.paged else allocator.release_pages
        return frozenset(allocator.free_pages.tolist()) | frozenset(released.tolist())

    def request_tables(self) -> dict[int, tuple[int, ...]]:
        """Each live request's table: the page of each of its rows' pages."""
        tables: dict[int, tuple[int, ...]] = {}
        for request_id, request in self.requests.items():
            slots = self.rows.req_to_token[request.kv.req_pool_idx, : len(request)].tolist()
            tables[request_id] = tuple(self._page(slot) for slot in slots[:: self.page_size])
        return tables

    def view(self) -> PoolView:
        tables = self.request_tables()
        tree = self.tree_pages()
        in_tables = [0] * self.pages
        for table in tables.values():
            for page in table:
                if 0 <= page < self.pages:
                    in_tables[page] += 1
        holders = [0 if page in tree else in_tables[page] for page in range(self.pages)]  # private: its tables
        walked = getattr(self.tree, "_tree_core_backend", "python") == "rust"
        for page, (_, locks) in tree.items():
            if 0 <= page < self.pages:  # a tree page: its node's lock count; the Rust core shows only
                # locked or not, so the tables' count when locked, and a lock no table explains as 1
                holders[page] = max(in_tables[page], 1) if walked and locks else locks
        return PoolView(
            holders=tuple(holders),
            free=self.free_pages(self.allocator),
            tables=tables,
            cached={page: key for page, (key, _) in tree.items()},
            reserved=frozenset({0}),
            evictable=frozenset(page for page, (_, locks) in tree.items() if locks == 0),
        )


def radix_events(pages: int, page_size: int) -> SglangRadixCache:
    """`radix_paged` publishing its KV events (`enable_kv_cache_events`), which the harness folds;
    one tenant (unsalted): SGLang's published block hash leaves a namespace that is not a LoRA
    adapter's out, so two tenants' pages of the same tokens publish one hash."""
    cache = SglangRadixCache(pages, page_size, paged=True, salted=False, events=True)
    cache.capabilities = cache.capabilities - {"tenants"}  # one tenant: its requests are not salted
    return cache


def restored_events(pages: int, page_size: int) -> SglangRadixCache:
    """A deliberately broken publisher (must fail): `radix_events` whose recorder publishes a
    page it removes stored again after its `BlockRemoved` (vLLM #49125's shape)."""
    cache = radix_events(pages, page_size)
    recorder = cache.tree.kv_events
    record_remove = recorder.record_remove

    def remove_then_store(node: Any, *args: Any, **kwargs: Any) -> None:
        record_remove(node, *args, **kwargs)
        recorder.record_store(node)

    recorder.record_remove = remove_then_store
    return cache


def radix_token(pages: int, page_size: int) -> SglangRadixCache:
    """SGLang's `RadixCache` over `TokenToKVPoolAllocator` (page size 1), LRU eviction."""
    return SglangRadixCache(pages, page_size, paged=False)


def radix_paged(pages: int, page_size: int) -> SglangRadixCache:
    """SGLang's `RadixCache` over `PagedTokenToKVPoolAllocator`, LRU eviction."""
    return SglangRadixCache(pages, page_size, paged=True)


def unified_token(pages: int, page_size: int) -> SglangRadixCache:
    """SGLang's `UnifiedRadixCache` (full attention, the Python tree core) over
    `TokenToKVPoolAllocator` (page size 1), LRU eviction."""
    return SglangRadixCache(pages, page_size, paged=False, tree_core="python")


def unified_paged(pages: int, page_size: int) -> SglangRadixCache:
    """SGLang's `UnifiedRadixCache` (full attention, the Python tree core) over
    `PagedTokenToKVPoolAllocator`, LRU eviction."""
    return SglangRadixCache(pages, page_size, paged=True, tree_core="python")


def unified_rust_token(pages: int, page_size: int) -> SglangRadixCache:
    """`unified_token` over SGLang's Rust tree core (its default; ValueError where it does not load)."""
    return SglangRadixCache(pages, page_size, paged=False, tree_core="rust")


def unified_rust_paged(pages: int, page_size: int) -> SglangRadixCache:
    """`unified_paged` over SGLang's Rust tree core (its default; ValueError where it does not load)."""
    return SglangRadixCache(pages, page_size, paged=True, tree_core="rust")
