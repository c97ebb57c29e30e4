"""The admission policy of impl's engine: the spec's `kvsched.spec.engine_admission` over impl's
parts.

    never_fits   why a request can never run on the engine (`fits`), refused at submit
    token_budget the tokens a step's prefill chunks may take beside its decode round
    admit        admit the front of the queue while the budget, the batch, the state slots,
                 the memory guard and the free pages allow: each newcomer's prefix (a named
                 one, else the cache's hits, else a host run to promote), its first chunk, and
                 its pages, attached and allocated for all newcomers in one call (`seat`)
    promote      issue the promotions the admissions planned (the step's commit)
    undo         take the step's admissions back (a model call failed); `forget` once it committed

A newcomer short of free pages stops the admissions: the step relieves what it is short of at
its end (`Shortfall`), once its model calls have succeeded, so admitting only takes pages.
`undo` takes a step's admissions back exactly (the newest first: their chunks' pages back in
place on the free stack, the pages they attached let go, the store's recency, their slots and
rows), for a step that fails after admitting. The part's state is one step's: the running
prefills' pages past their chunks (`committed`, summed once a step), the newcomers' host runs
until seated, their promotions until the commit issues them (`promotions`), and the admissions
seated until the step commits or takes them back (`seated`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsched.impl.engine_cache import CachePolicy
from kvsched.impl.engine_host import HostCopies
from kvsched.impl.engine_keys import PageKeys
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_rows import COMPUTED, LENGTH, NO_TOKEN
from kvsched.impl.engine_running import RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore, Recency, recency_of, restore_recency
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.impl.scheduler import (
    Newcomer,
    RequestScheduler,
    claim_slot,
    get_slots,
    seat_newcomers,
    unseat_newcomers,
)
from kvsched.impl.writes import ArrayWritePlan
from kvsched.spec.engine_admission import Shortfall
from kvsched.spec.engine_calls import Chunk, chunk_pages
from kvsched.spec.engine_config import EngineConfig, EngineRequest, admission_pages, fits, pages_for
from kvsched.spec.engine_state import Queued
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.page_keys import Key

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Seated:
    """A step's admissions, seated: their slots in order, the write plan of their chunks and
    the store's recency before their named prefixes were attached (what `Admission.undo` needs)."""

    slots: list[int]
    plan: ArrayWritePlan
    recency: Recency


class Admission:
    """The engine's admission policy; see the module docstring."""

    __slots__ = (
        "cache",
        "committed",
        "config",
        "copies",
        "fetching",
        "host",
        "keys",
        "policy",
        "pool",
        "promotions",
        "queue",
        "running",
        "scheduler",
        "seated",
        "store",
    )

    def __init__(
        self,
        config: EngineConfig,
        scheduler: RequestScheduler,
        store: PrefixKvStore,
        queue: WaitingQueue,
        running: RunningSet,
        keys: PageKeys,
        policy: CachePolicy,
        copies: HostCopies,
    ) -> None:
        self.config, self.scheduler, self.store, self.queue, self.running = config, scheduler, store, queue, running
        self.keys, self.policy, self.copies = keys, policy, copies
        self.pool: BlockPool = policy.pool
        self.cache: PrefixCache = policy.cache
        self.host: HostTier = policy.host
        self.committed: int | None = None  # this step's running prefills' pages past their chunks
        self.fetching: dict[int, list[tuple[Key, int, int]]] = {}  # newcomer slot -> its host run, until seated
        self.promotions: list[tuple[int, list[int], list[tuple[Key, int, int]]]] = []  # seated, until the commit
        self.seated: Seated | None = None  # this step's admissions, until it commits or takes them back

    def never_fits(self, request: EngineRequest) -> str | None:
        """Why `request` can never run on this engine (`fits`), or None."""
        return fits(self.config, request)

    def token_budget(self, decoding: int) -> int:
        """The tokens the step's prefill chunks may take, `decoding` requests decoding."""
        return self.config.max_batched_tokens - decoding

    def admit(self, budget: int, chunks: list[tuple[Chunk, int]]) -> tuple[Pairs, Shortfall | None]:
        """Admit newcomers into `budget` tokens beside the running prefills' `chunks`, appending
        each newcomer's chunk (one waiting for its promotions has none): the copies their pages
        need before the chunks run, and what the queue's front was short of (relieved at the
        step's end), if that stopped the admissions."""
        self.committed = None
        self.fetching.clear()
        self.promotions.clear()
        newcomers: list[Newcomer] = []
        claimed = 0  # the free pages the newcomers' chunks take
        shortfall = None
        while budget:
            admitted = self._admit_front(budget, self.pool.free_count() - claimed, newcomers, chunks)
            if admitted is None or isinstance(admitted, Shortfall):
                shortfall = admitted
                break
            if admitted[1] not in self.fetching:  # else it waits for its promotions
                chunks.append(admitted)
            budget -= admitted[0].length
            claimed += len(newcomers[-1].pages)
        return self.seat(newcomers), shortfall

    def seat(self, newcomers: list[Newcomer]) -> Pairs:
        """Attach and allocate the newcomers' pages, and plan the promotions into those of the
        ones that found pages in the host tier (`promote`, at the commit); the copies their
        chunks need."""
        if not newcomers:
            return ()
        recency = recency_of(self.store, [newcomer.identity for newcomer in newcomers])
        plan = seat_newcomers(self.scheduler, newcomers, self.store, self.pool)
        self.seated = Seated([newcomer.slot for newcomer in newcomers], plan, recency)
        tables = get_slots(self.scheduler).tables
        for newcomer in newcomers:
            run = self.fetching.pop(newcomer.slot, None)
            if run is not None:
                pages = [int(tables[newcomer.slot, depth]) for depth in newcomer.pages]
                self.promotions.append((newcomer.slot, pages, run))
        return copy_pairs(plan)

    def promote(self) -> None:
        """Issue the promotions the step's admissions planned (the commit's first change)."""
        for slot, pages, run in self.promotions:
            self.copies.promote(slot, self.running.request(slot).request_id, pages, run)
        self.promotions.clear()

    def forget(self) -> None:
        """The step's admissions are its for good (it committed): nothing left to take back."""
        self.seated = None

    def undo(self) -> None:
        """Take back the step's admissions, if it seated any, when nothing has changed since but
        later changes already taken back: their chunks' pages back in place on the free stack,
        the pages they attached let go, the store's recency as it was, their slots empty and
        their rows gone, the newest first (the queue and the cache undo their own parts); the
        promotions they planned are never issued."""
        seated, self.seated = self.seated, None
        self.promotions.clear()
        if seated is None:
            return
        unseat_newcomers(self.scheduler, seated.slots, seated.plan, self.pool)
        restore_recency(self.store, seated.recency)
        for slot in reversed(seated.slots):
            self.running.leave(slot)
        self.running.admissions -= len(seated.slots)

    def guarded(self, free: int) -> bool:
        """The memory guard stops admissions: fewer than `prefill_reserve_pages` are `free` while
        requests run (an empty batch is never starved)."""
        return free < self.config.prefill_reserve_pages and bool(self.running.slots)

    def reused(self, tokens: int, length: int) -> int:
        """Of a named prefix's `tokens`, those a sequence of `length` reuses: all but its last
        token at most (recomputed, so the request samples from its own logits)."""
        return min(tokens, length - 1)

    def _admit_front(
        self, budget: int, free: int, newcomers: list[Newcomer], chunks: list[tuple[Chunk, int]]
    ) -> tuple[Chunk, int] | Shortfall | None:
        """Admit the front of the queue into `newcomers` (its pages not yet seated), with `free`
        pages left: its chunk and slot; a `Shortfall` when its pages are not free; else None."""
        front = self.queue.front()
        if front is None or len(self.running.slots) >= self.config.max_batch_size:
            return None
        if self.guarded(free):
            return None
        if not self.running.state_slot_free():
            return None
        request = front.request
        length_of = len(request.prompt) + len(front.generated)
        identity, named, cached = self._usable_prefix(request.prefix, length_of, budget)
        page_size = self.config.page_size
        keys: list[Key] = []
        hit: list[int] = []
        fetch: list[tuple[Key, int, int]] = []
        if self.config.prefix_caching:
            keys = self._keys_of(front, length_of // page_size)
            if cached % page_size == 0:
                wanted = keys[cached // page_size : (length_of - 1) // page_size]
                hit = self.cache.lookup(wanted)
                if self.host.pages and identity is None:
                    fetch = self.host.run(wanted[len(hit) :])
        cached += len(hit) * page_size
        fetched = len(fetch) * page_size
        length = min(self.config.chunk_size, length_of - cached - fetched, budget)
        pages = chunk_pages(cached + fetched, length, page_size)
        needed = max(len(fetch) + len(pages), self._admission_pages(length_of, cached, free, chunks))
        if needed > free:
            return Shortfall(needed, tuple(hit))  # relieved at the step's end: this one writes no freed page
        request_id = request.request_id
        slot = claim_slot(self.scheduler, request_id)
        if fetch:  # fresh pages for the host run, counted; it waits for their promotions (`promote`)
            pages, counted, length = range(cached // page_size, cached // page_size + len(fetch)), fetched, 0
            self.fetching[slot] = fetch
        else:
            counted = length if named + len(hit) * page_size == cached else 0  # a full hit's prefix counts it
        newcomers.append(Newcomer(slot, identity, hit, pages, counted))
        if self.config.prefix_caching:
            self.cache.count_query(length_of, len(hit) * page_size)
            self.keys.slots[slot] = keys
        self.queue.pop_front()
        running = self.running
        running.tokens[slot, : len(request.prompt)] = np.frombuffer(request.prompt_bytes, dtype="<u4")
        if front.generated:
            running.tokens[slot, len(request.prompt) : length_of] = front.generated
        state_slot = running.take_state_slot(request_id)
        eos = NO_TOKEN if request.eos_token_id is None else request.eos_token_id
        limit = len(request.prompt) + request.max_new_tokens
        cached += fetched
        running.fields[slot] = (length_of, limit, eos, cached, 0, running.admissions, state_slot)
        if self.committed is not None:  # the pages its prefill takes after this step's chunk
            self.committed += pages_for(length_of, page_size) - pages_for(cached + length, page_size)
        running.admissions += 1
        running.requests[slot] = request
        running.slots[request_id] = slot
        running.prefilling.add(slot)
        return Chunk(request_id, cached, length, ()), slot

    def _keys_of(self, entry: Queued, pages: int) -> list[Key]:
        """The keys of the queued `entry`'s first `pages` full pages (`PageKeys.of_queued`)."""
        return self.keys.of_queued(entry, pages, self.queue.kept_keys(entry))

    def _admission_pages(self, length: int, cached: int, free: int, chunks: list[tuple[Chunk, int]]) -> int:
        """The spec's `admission_pages`, the running prefills' rests from their fields; 0 when
        even the most they could need leaves `free` enough (the same admission, sooner known)."""
        if not self.running.slots:
            return 0
        most = admission_pages(self.config, length, cached, len(self.running.prefilling) * self.config.logical_pages)
        if most <= free:
            return 0
        committed = self.committed
        if committed is None:  # summed once a step, then kept up to date by each admission
            page_size, fields = self.config.page_size, self.running.fields
            recorded = {slot: chunk.start + chunk.length for chunk, slot in chunks}
            committed = 0
            for slot in self.running.prefilling:  # a few slots: a loop costs less than numpy's calls here
                computed = recorded.get(slot)
                if computed is None:
                    computed = fields[slot, COMPUTED].item()
                committed += pages_for(fields[slot, LENGTH].item(), page_size) - pages_for(computed, page_size)
            self.committed = committed
        return admission_pages(self.config, length, cached, committed)

    def _usable_prefix(
        self, identity: PrefixIdentity | None, length: int, budget: int
    ) -> tuple[PrefixIdentity | None, int, int]:
        """The named prefix a request of `length` tokens can attach: its identity, its tokens and
        the tokens it leaves uncomputed (all but the last token at most); else (None, 0, 0)."""
        page_set = None if identity is None else self.store.get(identity)
        if page_set is None or page_set.token_count > length:
            return None, 0, 0
        cached = self.reused(page_set.token_count, length)
        if length - cached > min(self.config.chunk_size, budget):
            return None, 0, 0
        return identity, page_set.token_count, cached

    def __repr__(self) -> str:
        return f"Admission({len(self.queue)} queued, {len(self.running.slots)} running)"


def copy_pairs(plan: ArrayWritePlan) -> Pairs:
    """A write plan's copy-on-write copies as (source, destination) pairs."""
    return tuple(zip(plan.copy_sources.tolist(), plan.copy_destinations.tolist(), strict=True))
