"""Deliberately broken engines: proof that the engine harness can fail.

Each variant is impl's `Engine` with one method (of the engine or one of its parts: its
`PrefixCache`, `HostTier`, `Leases`, `PageKeys`, `RunningSet`, `WaitingQueue`, `Admission`,
`CachePolicy`, `HostCopies`, `Batch` or `CachePublisher`) replaced by a seam override: a function of a few visible lines
that takes the method's place in a subclass, reintroducing a bug serving engines have shipped
(as `devtools/mutants_corpus.py` does for impl's parts; no engine source is edited as text).
`ENGINE_VARIANTS` names each, the bug it is, the machine shape it runs on, and the check that
must catch it with the spec beside it (`with_reference`) and without (`alone`: the engine's own
checks).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np

from kvsched.impl.engine import Engine
from kvsched.impl.engine_admission import Admission
from kvsched.impl.engine_batch import Batch
from kvsched.impl.engine_cache import CachePolicy
from kvsched.impl.engine_events import CachePublisher
from kvsched.impl.engine_host import HostCopies
from kvsched.impl.engine_keys import PageKeys
from kvsched.impl.engine_leases import Leases
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_running import Record, RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool, release_array
from kvsched.impl.prefix_cache import Mark, PrefixCache
from kvsched.impl.scheduler import Newcomer, get_slots
from kvsched.spec.engine_calls import call_model, copy_batches
from kvsched.spec.engine_config import EngineConfig, EngineRequest, salt_of
from kvsched.spec.engine_events import Published, Publisher
from kvsched.spec.engine_state import Queued
from kvsched.spec.errors import BackendFailed
from kvsched.spec.host_tier import Copy
from kvsched.spec.kv_events import Entry, EventBatch, Removed, Stored
from kvsched.spec.model import HostCopy
from kvsched.spec.page_keys import CacheSalt, Key
from kvsched.testing.checks import FailureKind


@dataclass(frozen=True, slots=True)
class EngineVariant:
    """A broken engine: which method, what replaces it, the bug, and the checks that catch it."""

    name: str
    sentence: str
    method: str
    seam: Callable[..., Any]  # the method's replacement
    with_reference: FailureKind
    alone: FailureKind | None  # None: only the spec's lockstep can tell
    shape: str = "default"  # the engine machine's shape it runs on
    target: type[Any] = Engine  # the class whose method is replaced: the engine or one of its parts
    examples: int = 300  # the machine's search (make verify): programs tried
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
        broken = type(f"{self.target.__name__}_{self.name}", (self.target,), {self.method: self.seam, "__slots__": ()})
        if self.target is Engine:
            return lambda config, model: broken(config, model)

        def build(config: EngineConfig, model: Any) -> Engine:
            engine = Engine(config, model)
            parts = {
                PrefixCache: engine.cache,
                HostTier: engine.host,
                Leases: engine.leases,
                PageKeys: engine.keys,
                RunningSet: engine.running,
                WaitingQueue: engine.queue,
                Admission: engine.admission,
                CachePolicy: engine.cache_policy,
                HostCopies: engine.host_copies,
                Batch: engine.batch,
                CachePublisher: engine.events,
            }
            part = parts[self.target]
            part.__class__ = broken
            return engine

        return build


# -- seam overrides ------------------------------------------------------------------------------


class TwoCallCopier(Protocol):
    """The copy protocol before `start_copies` (the harness model still serves it)."""

    def copy_to_device(self, copies: Sequence[HostCopy]) -> None: ...

    def copy_to_host(self, copies: Sequence[HostCopy]) -> None: ...


def issue_copies_in_two_calls(self: Engine, copies: list[Copy]) -> None:
    """The copy protocol before `start_copies`: the promotions, then the demotions, in two calls.
    When the second raises, the engine takes every copy for not started and fails them all: the
    promotions the first call started run on, into pages the engine lets go."""
    model = cast(TwoCallCopier, self.model)
    to_device, to_host = copy_batches(copies)
    if to_device:
        call_model(lambda: model.copy_to_device(to_device))
    if to_host:
        call_model(lambda: model.copy_to_host(to_host))


def keep_unstarted_copies(self: Engine, copies: list[Copy], record: Record) -> None:
    """A `start_copies` that raises is taken for a start: the step's copies stay in flight,
    though the backend runs none of them."""
    with suppress(BackendFailed):
        self._issue_copies(copies)


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


def stores_what_it_removes(self: CachePublisher, before: Iterable[Entry], now: Published) -> EventBatch | None:
    """`Publisher.publish`, each entry it removes stored again after its removal."""
    batch = Publisher.publish(self, before, now)
    if batch is None:
        return None
    removed = [event for event in batch.events if isinstance(event, Removed)]
    again = tuple(Stored(event.key, None, self.tokens, event.tier) for event in removed)
    return replace(batch, events=(*batch.events, *again))


def keys_of_the_session(self: PageKeys, request: EngineRequest) -> list[Key]:
    """`PageKeys.of_prompt`, a prompt that opens as an earlier one did (its session) keeping the
    earlier one's keys as far as they went, whatever its later pages hold."""
    keys = PageKeys.of_prompt(self, request)
    if not keys:
        return keys
    sessions: dict[Key, list[Key]] = self.hasher.__dict__.setdefault("sessions", {})  # first key -> the last keys
    kept, sessions[keys[0]] = sessions.get(keys[0], []), list(keys)
    return kept[: len(keys)] + keys[len(kept) :]


def salt_without_adapter(self: PageKeys, request: EngineRequest) -> CacheSalt:
    """A page key salted with the tenant but not the LoRA adapter."""
    return salt_of(self.config, replace(request, adapter=0))


def budget_without_decode(self: Admission, decoding: int) -> int:
    """The prefill budget forgets the decode tokens: a step runs more than `max_batched_tokens`."""
    return self.config.max_batched_tokens


def requeue_at_the_back(self: WaitingQueue, entry: Queued, *, front: bool, keys: list[Key] | None = None) -> None:
    """Every request joins the back of its class, a preempted one too."""
    WaitingQueue.push(self, entry, front=False, keys=keys)


def fits_anything(self: Admission, request: EngineRequest) -> str | None:
    """No request is too large for the engine."""
    return None


def no_victim(self: Batch) -> int | None:
    """Under pressure nobody is preempted."""
    return None


def reuse_every_token(self: Admission, tokens: int, length: int) -> int:
    """A full hit reuses every token: nothing is left to prefill."""
    return tokens


def never_guarded(self: Admission, free: int) -> bool:
    """The memory guard never stops an admission."""
    return False


def free_state_slot_twice(self: RunningSet, state_slot: int) -> None:
    """A released state slot is pushed on the free heap twice."""
    RunningSet.free_state_slot(self, state_slot)
    heapq.heappush(self.state_free, state_slot)


def skip_round_copies(self: Batch, pairs: tuple[tuple[int, int], ...]) -> None:
    """The decode round's copy-on-write copies never reach the model."""


def keep_failed_step(self: Engine, mark: Mark) -> None:
    """A failed step is not undone."""


def keep_failed_room(self: Engine) -> None:
    """A failed step's room stays taken: its new pages stay mapped."""


def keep_round_answers(self: Batch) -> None:
    """A failed step takes its room back but not its decode round's answers: the decoding
    requests' counts and input tokens stay where the round left them."""
    self.ran = 0
    Batch.undo_room(self)


def keep_admissions(self: Admission) -> None:
    """A failed step forgets its admissions instead of taking them back: the newcomers keep
    their slots and pages, and the queue gets them back too."""
    self.seated = None


def cache_when_seated(self: Admission, newcomers: list[Newcomer]) -> tuple[tuple[int, int], ...]:
    """Newcomers' full pages enter the cache when their pages are seated, before their KV is written."""
    copies = Admission.seat(self, newcomers)
    for newcomer in newcomers:
        keys = self.keys.slots[newcomer.slot]
        first, end = newcomer.pages.start, min(len(keys), newcomer.pages.stop)
        if first < end:
            pages = get_slots(self.scheduler).tables[newcomer.slot][first:end].tolist()
            parents = [keys[first - 1] if first else None, *keys[first : end - 1]]
            self.cache.insert(self.pool, keys[first:end], pages, range(first, end), parents)
    return copies


def evict_keeping_keys(self: PrefixCache, pool: BlockPool, pages: np.ndarray[Any, Any]) -> None:
    """Evicted pages are released, their keys kept."""
    release_array(pool, pages)


def hold_nothing(self: PrefixCache, pool: BlockPool, pages: Any) -> None:
    """The cache takes no reference of its own."""


def salt_without_tenant(self: PageKeys, request: EngineRequest) -> CacheSalt:
    """A page key salted without the tenant: two tenants with one prompt share pages."""
    return salt_of(self.config, replace(request, tenant=0))


def demote_without_a_hold(self: CachePolicy, page: int) -> None:
    """A demotion's copy takes no hold on the page it reads."""


def wait_for_nothing(self: HostCopies, slot: int) -> bool:
    """A request computes on pages whose promotions have not completed."""
    return False


def failed_copy_done(self: HostCopies, done: dict[int, bool], copy: Copy) -> bool | None:
    """Every copy the model reported, completed or failed, counts as completed."""
    return True if copy.transfer_id in done else None


def find_nothing_on_the_host(self: HostTier, keys: Any) -> list[tuple[Key, int, int]]:
    """A lookup never finds a host page."""
    return []


def reclaim_read_pages(self: HostTier, host_page: int) -> bool:
    """A demotion may take a host page a promotion still reads."""
    return True


def lease_holding_nothing(self: Leases, pool: BlockPool, pages: tuple[int, ...]) -> tuple[int, ...]:
    """A lease takes no reference on the pages its reader will read."""
    return ()


ENGINE_VARIANTS = (
    EngineVariant(
        "preempt_to_back",
        "a preempted request re-enters at the back of the queue and loses its place (vLLM #41951)",
        "push",
        requeue_at_the_back,
        FailureKind.LOCKSTEP,
        FailureKind.ORDER,
        target=WaitingQueue,
    ),
    EngineVariant(
        "admit_too_large",
        "a request larger than the cache is accepted and blocks the queue forever (vLLM #39734)",
        "never_fits",
        fits_anything,
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,
        target=Admission,
    ),
    EngineVariant(
        "never_preempt",
        "KV pressure makes every step fail instead of preempting: the scheduler deadlocks (vLLM #45388)",
        "victim",
        no_victim,
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,
        target=Batch,
    ),
    EngineVariant(
        "full_hit_prefills_nothing",
        "a full prefix hit prefills zero tokens and samples logits it never computed (nano-vllm PR #199)",
        "reused",
        reuse_every_token,
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,
        target=Admission,
    ),
    EngineVariant(
        "skip_memory_guard",
        "admission ignores the free-page reserve while requests run",
        "guarded",
        never_guarded,
        FailureKind.LOCKSTEP,
        None,
        target=Admission,
    ),
    EngineVariant(
        "state_slot_released_twice",
        "a finished request's recurrent-state slot is released twice, so two requests share it",
        "free_state_slot",
        free_state_slot_twice,
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        target=RunningSet,
    ),
    EngineVariant(
        "decode_copies_skipped",
        "the decode round's copy-on-write copies are never handed to the model",
        "copy_round_pages",
        skip_round_copies,
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,
        target=Batch,
    ),
    EngineVariant(
        "failed_step_kept",
        "a model failure leaves the step's allocations and tokens behind",
        "_undo_plan",
        keep_failed_step,
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
    ),
    EngineVariant(
        "failed_round_kept",
        "a model failure leaves the room's new pages mapped",
        "_undo_room",
        keep_failed_room,
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
    ),
    EngineVariant(
        "round_answers_kept",
        "a prefill that fails after the step's decode round ran keeps the round's answers in the slots",
        "undo_room",
        keep_round_answers,
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
        target=Batch,
    ),
    EngineVariant(
        "admissions_kept",
        "a prefill that fails after the step admitted keeps the newcomers seated, and queued again",
        "undo",
        keep_admissions,
        FailureKind.LOCKSTEP,
        FailureKind.ATOMICITY,
        target=Admission,
    ),
    EngineVariant(
        "publish_on_allocation",
        "a page enters the prefix cache when it is allocated, before its KV is written (TGI #2489)",
        "seat",
        cache_when_seated,
        FailureKind.LOCKSTEP,
        FailureKind.CACHE,
        shape="cached_tight",  # a chunk of one token: a page is allocated a step before it is full
        target=Admission,
    ),
    EngineVariant(
        "evict_keeps_key",
        "an evicted page is freed but its key still maps to it: a stale page served for a new prefix (nano-vllm #163)",
        "_evicted",
        evict_keeping_keys,
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="cached",
        target=PrefixCache,
    ),
    EngineVariant(
        "cache_holds_no_reference",
        "the cache takes no reference of its own, so a page freed by its last request is reused while"
        " its key still maps to it (vLLM #5543)",
        "_hold",
        hold_nothing,
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="cached",
        target=PrefixCache,
    ),
    EngineVariant(
        "salt_dropped",
        "page keys leave out the tenant, so two tenants with the same prompt share KV pages"
        " (vLLM's hash-collision advisory)",
        "salt",
        salt_without_tenant,
        FailureKind.LOCKSTEP,
        FailureKind.ISOLATION,
        shape="cached",
        target=PageKeys,
    ),
    EngineVariant(
        "demotion_source_freed",
        "a demoted page is evicted and reused while its copy to the host still reads it: the host keeps"
        " another request's KV (DingoCache PR #76; TRT-LLM #8813's wrong-tokens class)",
        "hold_demoted",
        demote_without_a_hold,
        FailureKind.LIVENESS,  # a copy that fails releases a hold it never took: a failing tier stalls it
        FailureKind.LIVENESS,
        shape="host",
        target=CachePolicy,
    ),
    EngineVariant(
        "promotion_not_awaited",
        "a request computes on pages whose copy from the host has not completed: it reads KV never"
        " written (SGLang PR #33970's class)",
        "waits",
        wait_for_nothing,
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,  # its chunk committed after its failed promotion preempted it
        shape="host",
        examples=3000,  # a promotion must be awaited while other requests run
        target=HostCopies,
    ),
    EngineVariant(
        "failed_promotion_served",
        "a copy from the host that failed is taken as completed: the request reads the partial write"
        " (TRT-LLM #8813: reused offloaded blocks restore the wrong KV)",
        "outcome",
        failed_copy_done,
        FailureKind.LOCKSTEP,
        FailureKind.CACHE,
        shape="host",
        examples=3000,  # a promotion must be in flight when a step fails copies
        target=HostCopies,
    ),
    EngineVariant(
        "host_lookup_misses",
        "host pages are never found by a lookup: every request recomputes what the host holds (vLLM #53498)",
        "run",
        find_nothing_on_the_host,
        FailureKind.LOCKSTEP,
        None,
        shape="host",
        target=HostTier,
    ),
    EngineVariant(
        "host_page_taken_while_read",
        "a host page a promotion still reads is reclaimed for a demotion (SGLang PR #38480: the host"
        " lock lost, host pages reclaimed mid-transfer)",
        "_reclaimable",
        reclaim_read_pages,
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="host_small",
        target=HostTier,
        examples=3000,  # the host full while a promotion reads its least recently used page: a round trip
    ),
    EngineVariant(
        "lease_holds_nothing",
        "a connector's save takes no hold on the pages it reads: a finish frees them and another"
        " request's KV reaches the save (DingoCache PR #76, SGLang #24527)",
        "_hold",
        lease_holding_nothing,
        FailureKind.LOCKSTEP,
        FailureKind.GHOST,
        shape="cached",
        target=Leases,
    ),
    EngineVariant(
        "copies_issued_in_two_calls",
        "a step starts its promotions, then fails to start its demotions and fails every copy: the"
        " promotions it forgot land on pages the engine hands to a newcomer (kvsched's own copy protocol, 12-06)",
        "_issue_copies",
        issue_copies_in_two_calls,
        FailureKind.LOCKSTEP,  # a step that starts promotions alone fails in the spec, not in it
        FailureKind.GHOST,
        shape="host",
        explorer="HOSTED",  # a promotion and a demotion started in one step whose copy call fails
    ),
    EngineVariant(
        "unstarted_copies_kept",
        "a step whose start_copies raised keeps its copies in flight, though none runs: the engine waits"
        " on copies the backend never started (kvsched's own copy protocol, 12-08)",
        "_start_copies",
        keep_unstarted_copies,
        FailureKind.LOCKSTEP,
        FailureKind.LIVENESS,
        shape="host",
    ),
    EngineVariant(
        "failed_demotion_retried",
        "a page whose demotion to the host failed stays cached and is demoted again at the next eviction:"
        " with the host failing, the engine never serves its queue (kvsched's own host tier, 12-06)",
        "wants",
        wants_refused_pages,
        FailureKind.LIVENESS,  # a failing tier's drain stalls before any step differs from the spec's
        FailureKind.LIVENESS,
        shape="host",
        target=HostTier,
    ),
    EngineVariant(
        "failed_host_page_first",
        "a host page a copy failed on is freed to the top of the free stack and handed straight back"
        " to the next demotion (kvsched's own host tier, 12-06)",
        "complete",
        complete_to_the_top,
        FailureKind.LOCKSTEP,
        None,
        shape="host",
        target=HostTier,
    ),
    EngineVariant(
        "adapter_dropped",
        "page keys keep the tenant but leave out the LoRA adapter: one adapter's KV is served to another"
        " (vLLM #30931's class)",
        "salt",
        salt_without_adapter,
        FailureKind.LOCKSTEP,
        FailureKind.ISOLATION,
        shape="cached",
        target=PageKeys,
    ),
    EngineVariant(
        "budget_forgets_decode",
        "the prefill budget forgets the step's decode tokens: a step runs more tokens than max_batched_tokens",
        "token_budget",
        budget_without_decode,
        FailureKind.LOCKSTEP,
        FailureKind.INVARIANT,
        shape="roomy",
        target=Admission,
    ),
    EngineVariant(
        "stored_after_removed",
        "the KV event publisher stores again each block it removes, after its BlockRemoved: a router's"
        " index keeps a block the engine evicted (vLLM #49125)",
        "publish",
        stores_what_it_removes,
        FailureKind.EVENTS,
        FailureKind.EVENTS,
        shape="cached_tight",
        target=CachePublisher,
    ),
    EngineVariant(
        "session_keeps_stale_keys",
        "a prompt that opens as an earlier one did keeps the earlier one's page keys, whatever its later"
        " pages hold: its pages are cached, and hit, under keys naming other tokens (vLLM #49449's class)",
        "of_prompt",
        keys_of_the_session,
        FailureKind.LOCKSTEP,
        FailureKind.DETERMINISM,  # a stale key's hit serves another prompt's KV: other tokens
        shape="cached",
        target=PageKeys,
    ),
)
