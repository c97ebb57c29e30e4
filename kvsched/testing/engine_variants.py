"""Deliberately broken engines: proof that the engine harness can fail.

Each variant is impl's `Engine` with one method (of the engine, its `PrefixCache` or its
`HostTier`) replaced, reintroducing a bug serving engines have shipped: either by a seam
override (`seam`: a function that takes the method's place, a few visible lines; the form new
variants take) or, for the older ones, recompiled with one edit
(`kvsched.testing.patching.patch_source`). `ENGINE_VARIANTS` names each, the bug it is, the
machine shape it runs on, and the check that must catch it with the spec beside it
(`with_reference`) and without (`alone`: the engine's own checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvsched.impl.engine import Engine
from kvsched.impl.host_tier import HostTier
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.spec.engine_calls import call_model, copier
from kvsched.spec.engine_config import EngineConfig, EngineRequest, salt_of
from kvsched.spec.host_tier import DEMOTE, Copy
from kvsched.spec.model import HostCopy
from kvsched.spec.page_keys import CacheSalt, Key
from kvsched.testing.checks import FailureKind
from kvsched.testing.patching import patch_source


@dataclass(frozen=True, slots=True)
class EngineVariant:
    """A broken engine: which method, what edit, the bug, and the checks that catch it."""

    name: str
    sentence: str
    method: str
    edits: tuple[tuple[str, str], ...]
    with_reference: FailureKind
    alone: FailureKind | None  # None: only the spec's lockstep can tell
    shape: str = "default"  # the engine machine's shape it runs on
    target: type[Any] = Engine  # the class whose method is edited: Engine, PrefixCache or HostTier
    examples: int = 300  # the machine's search (make verify): programs tried
    seam: Callable[..., Any] | None = None  # the method's replacement (then `edits` is empty)
    # the engine explorer's bounds (`kvsched.proofs.engine_explorer`) whose search finds it, for a
    # bug the machine's random programs rarely line up; its golden programs are the explorer's paths
    explorer: str | None = None

    def config(self) -> EngineConfig:
        """The configuration its programs run on: its machine shape's, or its explorer bounds'."""
        if self.explorer is not None:
            from kvsched.proofs import engine_explorer

            bounds: Any = getattr(engine_explorer, self.explorer)
            config: EngineConfig = bounds.config
            return config
        from kvsched.testing.engine_machine import SHAPES

        return SHAPES[self.shape]

    def factory(self) -> Callable[[EngineConfig, Any], Engine]:
        """Build engines of this variant."""
        patched = self.seam or patch_source(getattr(self.target, self.method), self.edits, self.name)
        broken = type(f"{self.target.__name__}_{self.name}", (self.target,), {self.method: patched})
        if self.target is Engine:
            return lambda config, model: broken(config, model)

        def build(config: EngineConfig, model: Any) -> Engine:
            engine = Engine(config, model)
            part = engine.cache if self.target is PrefixCache else engine.host
            part.__class__ = broken
            return engine

        return build


# -- seam overrides ------------------------------------------------------------------------------


def issue_copies_in_two_calls(self: Engine, copies: list[Copy]) -> None:
    """The copy protocol before `start_copies`: the promotions, then the demotions, in two calls.
    When the second raises, the step is undone and forgets the promotions the first started."""
    model = copier(self.model)
    to_device = [HostCopy(copy.transfer_id, copy.host_page, copy.page) for copy in copies if copy.kind != DEMOTE]
    to_host = [HostCopy(copy.transfer_id, copy.page, copy.host_page) for copy in copies if copy.kind == DEMOTE]
    if to_device:
        call_model(lambda: model.copy_to_device(to_device))  # type: ignore[attr-defined]
    if to_host:
        call_model(lambda: model.copy_to_host(to_host))  # type: ignore[attr-defined]


def wants_refused_pages(self: HostTier, page: int, key: Key) -> bool:
    """The host wants a page whose demotion failed again: a failing tier is retried forever."""
    refused, self.refused = self.refused, []
    try:
        return HostTier.wants(self, page, key)
    finally:
        self.refused = refused


def complete_to_the_top(self: HostTier, copy: Copy, ok: bool) -> None:
    """`HostTier.complete`, a failed copy's host page freed to the top of the free stack."""
    HostTier.complete(self, copy, ok)
    free = self._free
    if not ok and free and free[0] == copy.host_page:
        free.append(free.pop(0))


def salt_without_adapter(self: Engine, request: EngineRequest) -> CacheSalt:
    """A page key salted with the tenant but not the LoRA adapter."""
    return salt_of(self.config, replace(request, adapter=0))


def budget_without_decode(self: Engine, decoding: int) -> int:
    """The prefill budget forgets the decode tokens: a step runs more than `max_batched_tokens`."""
    return self.config.max_batched_tokens


ENGINE_VARIANTS = (
    EngineVariant(
        "preempt_to_back",
        "a preempted request re-enters at the back of the queue and loses its place (vLLM #41951)",
        "_preempt",
        (("front=True", "front=False"),),
        FailureKind.LOCKSTEP,
        FailureKind.ORDER,
    ),
    EngineVariant(
        "admit_too_large",
        "a request larger than the cache is accepted and blocks the queue forever (vLLM #39734)",
        "submit",
        (("why = fits(self.config, request)", "why = None"),),
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,
    ),
    EngineVariant(
        "never_preempt",
        "KV pressure makes every step fail instead of preempting: the scheduler deadlocks (vLLM #45388)",
        "_make_room",
        (("slot = self._victim()", "slot = None"),),
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,
    ),
    EngineVariant(
        "full_hit_prefills_nothing",
        "a full prefix hit prefills zero tokens and samples logits it never computed (nano-vllm PR #199)",
        "_usable_prefix",
        (("cached = min(page_set.token_count, length - 1)", "cached = page_set.token_count"),),
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,
    ),
    EngineVariant(
        "skip_memory_guard",
        "admission ignores the free-page reserve while requests run",
        "_admit",
        (("if free < self.config.prefill_reserve_pages and self._running:", "if False:"),),
        FailureKind.LOCKSTEP,
        None,
    ),
    EngineVariant(
        "state_slot_released_twice",
        "a finished request's recurrent-state slot is released twice, so two requests share it",
        "_release",
        (
            (
                "heapq.heappush(self._state_free, state_slot)",
                "heapq.heappush(self._state_free, state_slot)\n        heapq.heappush(self._state_free, state_slot)",
            ),
        ),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
    ),
    EngineVariant(
        "decode_copies_skipped",
        "the decode round's copy-on-write copies are never handed to the model",
        "_run_round",
        (("call_model(lambda: self.model.copy_pages(pairs))", "pass"),),
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,
    ),
    EngineVariant(
        "failed_step_kept",
        "a model failure leaves the step's allocations and tokens behind",
        "step",
        (("self._rollback(saved)", "pass"),),
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
    ),
    EngineVariant(
        "failed_round_kept",
        "a model failure in a step that only decodes leaves the round's new pages mapped",
        "_decode_step",
        (("undo_decode_round(self.scheduler, plan, self.pool)", "pass"),),
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
    ),
    EngineVariant(
        "publish_on_allocation",
        "a page enters the prefix cache when it is allocated, before its KV is written (TGI #2489)",
        "_prefill",
        (
            (
                "    copies += self._seat(newcomers)\n    if chunks:",
                "    copies += self._seat(newcomers)\n"
                "    for newcomer in newcomers:\n"
                "        keys = self._page_keys[newcomer.slot]\n"
                "        table = get_slots(self.scheduler).tables[newcomer.slot]\n"
                "        first, end = newcomer.pages.start, min(len(keys), newcomer.pages.stop)\n"
                "        if first < end:\n"
                "            pages = table[first:end].tolist()\n"
                "            self.cache.insert(self.pool, keys[first:end], pages, range(first, end))\n"
                "    if chunks:",
            ),
        ),
        FailureKind.LOCKSTEP,
        FailureKind.CACHE,
        shape="cached_tight",  # a chunk of one token: a page is allocated a step before it is full
    ),
    EngineVariant(
        "evict_keeps_key",
        "an evicted page is freed but its key still maps to it: a stale page served for a new prefix (nano-vllm #163)",
        "evict",
        (("self._leave(pool, victims)", "release_array(pool, victims)"),),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="cached",
        target=PrefixCache,
    ),
    EngineVariant(
        "cache_holds_no_reference",
        "the cache takes no reference of its own, so a page freed by its last request is reused while"
        " its key still maps to it (vLLM #5543)",
        "insert",
        (("        retain_array(pool, added)", "        pass"),),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="cached",
        target=PrefixCache,
    ),
    EngineVariant(
        "salt_dropped",
        "page keys leave out the tenant, so two tenants with the same prompt share KV pages"
        " (vLLM's hash-collision advisory)",
        "_salt",
        (("= salt_of(self.config, request)", "= salt_of(self.config, replace(request, tenant=0))"),),
        FailureKind.LOCKSTEP,
        FailureKind.ISOLATION,
        shape="cached",
    ),
    EngineVariant(
        "demotion_source_freed",
        "a demoted page is evicted and reused while its copy to the host still reads it: the host keeps"
        " another request's KV (DingoCache PR #76; TRT-LLM #8813's wrong-tokens class)",
        "_evict",
        (("self.pool.retain(page)", "pass"),),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="host",
    ),
    EngineVariant(
        "promotion_not_awaited",
        "a request computes on pages whose copy from the host has not completed: it reads KV never"
        " written (SGLang PR #33970's class)",
        "_room_for_running",
        (("if slot in self._waiting:", "if False:"),),
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,
        shape="host",
    ),
    EngineVariant(
        "failed_promotion_served",
        "a copy from the host that failed is taken as completed: the request reads the partial write"
        " (TRT-LLM #8813: reused offloaded blocks restore the wrong KV)",
        "_complete_copies",
        (("ok = done.get(copy.transfer_id)", "ok = True if copy.transfer_id in done else None"),),
        FailureKind.LOCKSTEP,
        FailureKind.CACHE,
        shape="host",
        examples=3000,  # a promotion must be in flight when a step fails copies
    ),
    EngineVariant(
        "host_lookup_misses",
        "host pages are never found by a lookup: every request recomputes what the host holds (vLLM #53498)",
        "run",
        (("entry = self._cache.get(key)", "entry = None"),),
        FailureKind.LOCKSTEP,
        None,
        shape="host",
        target=HostTier,
    ),
    EngineVariant(
        "host_page_taken_while_read",
        "a host page a promotion still reads is reclaimed for a demotion (SGLang PR #38480: the host"
        " lock lost, host pages reclaimed mid-transfer)",
        "demote",
        (("if not self._users[entry[0]]", "if True"),),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="host_small",
        target=HostTier,
        examples=3000,  # the host full while a promotion reads its least recently used page
    ),
    EngineVariant(
        "lease_holds_nothing",
        "a connector's save takes no hold on the pages it reads: a finish frees them and another"
        " request's KV reaches the save (DingoCache PR #76, SGLang #24527)",
        "lease",
        (("self.pool.retain(page)", "pass"), ("self._leases[lease_id] = pages", "self._leases[lease_id] = ()")),
        FailureKind.LOCKSTEP,
        FailureKind.GHOST,
        shape="cached",
    ),
    EngineVariant(
        "copies_issued_in_two_calls",
        "a step starts its promotions, then fails to start its demotions and is undone: the promotions"
        " it forgot land on pages the engine hands to a newcomer (kvsched's own copy protocol, 12-06)",
        "_issue_copies",
        (),
        FailureKind.LOCKSTEP,  # a step that starts promotions alone fails in the spec, not in it
        FailureKind.GHOST,
        shape="host",
        seam=issue_copies_in_two_calls,
        explorer="HOSTED",  # a promotion and a demotion started in one step whose copy call fails
    ),
    EngineVariant(
        "failed_demotion_retried",
        "a page whose demotion to the host failed stays cached and is demoted again at the next eviction:"
        " with the host failing, the engine never serves its queue (kvsched's own host tier, 12-06)",
        "wants",
        (),
        FailureKind.LIVENESS,  # a failing tier's drain stalls before any step differs from the spec's
        FailureKind.LIVENESS,
        shape="host",
        target=HostTier,
        seam=wants_refused_pages,
    ),
    EngineVariant(
        "failed_host_page_first",
        "a host page a copy failed on is freed to the top of the free stack and handed straight back"
        " to the next demotion (kvsched's own host tier, 12-06)",
        "complete",
        (),
        FailureKind.LOCKSTEP,
        None,
        shape="host",
        target=HostTier,
        seam=complete_to_the_top,
    ),
    EngineVariant(
        "adapter_dropped",
        "page keys keep the tenant but leave out the LoRA adapter: one adapter's KV is served to another"
        " (vLLM #30931's class)",
        "_salt",
        (),
        FailureKind.LOCKSTEP,
        FailureKind.ISOLATION,
        shape="cached",
        seam=salt_without_adapter,
    ),
    EngineVariant(
        "budget_forgets_decode",
        "the prefill budget forgets the step's decode tokens: a step runs more tokens than max_batched_tokens",
        "_token_budget",
        (),
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="roomy",
        seam=budget_without_decode,
    ),
)
