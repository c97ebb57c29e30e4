"""The continuous-batching engine: intake, one step at a time, preemption by recompute.

`Engine(config, model)` owns a pool, a prefix store and a request scheduler (the certified
parts) and runs the loop an inference engine runs every iteration:

    submit(request)  a bounded intake queue: QueueFull, then DuplicateRequest, then
                     RequestTooLarge (a request that can never run is refused here)
    cancel(id)       queued or running alike: pages and state slot released at once, exactly as
                     on finish; reported as CANCELLED by the next step, and the id refused
                     (DuplicateRequest) until that step has run
    publish(id, n, identity)  publish a running request's KV for its first n tokens as a prefix
    fork(parent, child)       run a copy of a running request, sharing its pages copy-on-write
    step()           one iteration, below; returns a `StepOutput`
    has_work()       something is queued, running or not yet reported
    reset_cache()    drop every page of the automatic prefix cache (`CacheInUse` while held)
    lease(id)        an asynchronous reader (a connector's save, a disaggregated send) holds a
                     running request's written pages, whatever happens to the request, until
    end_lease(lease) it has read them and lets go

One step is a function on values, `run_step(state, config, model) -> (state, output)`, in three
parts: `plan_step` decides everything the step does before the model runs (1-3), `run_model`
makes the model calls that plan names (4, `kvsched.spec.engine_calls`), `commit_step` applies
their answers (5-7). The engine holds the state `run_step` returns, and only then.
1. Room: make room for every decoding request's next token (`prepare_decode_round`) and for
   each running prefill's next chunk (strict priority, then admission order; one
   `record_chunk` per chunk, which makes room for it and counts it, at most `chunk_size` tokens,
   within the budget the decode tokens leave). Decode goes first and is never starved:
   `max_batched_tokens >= max_batch_size`, so every decoding request fits. The decode round is
   lowered (its items and tables) on the state this leaves.
2. Pressure (preemption by recompute, seed B's Phase 2): when that room cannot be had, idle
   published prefixes are reclaimed first, then the lowest-priority, latest-admitted running
   request is preempted: its pages and state slot are released and it re-enters the queue at
   the front of its priority class with its generated tokens, to be recomputed (prompt +
   generated) when readmitted. When one request is left to preempt, a published prefix that alone
   holds a page (though it shares others with that request, so it is not idle) is removed
   instead: preempting the last request would readmit it to the same pages, forever. Once
   everything fits, the step ends there, having run nothing:
   a step that frees pages never writes them, so a failed step can always be undone exactly.
   A newcomer never preempts anyone.
3. Admissions, with the tokens the decode round and the running chunks leave: from the queue
   front while a batch seat, the budget, a state slot and free pages for the first chunk are
   there, the memory guard allows (free pages >= `prefill_reserve_pages`, or nothing running)
   and so does the admission policy (`admission`: with "whole_prompt", the default, while
   anything runs, the free pages must hold the rest of the newcomer's whole sequence and the
   pages every running prefill still needs past this step's chunks, so admitted prompts do not
   preempt each other's prefills); admission stops at the first request that cannot be
   admitted, keeping its place (idle prefixes are reclaimed for it, and a later step admits
   it). A published prefix is attached only when the rest of the sequence fits the first
   chunk; a full hit recomputes the last prompt token, so every request prefills at least one
   token and samples from its own logits. Each chunk (a running prefill's or an admission's,
   already made room for and counted by one `record_chunk`) becomes one prefill item.
4. The model: copy the shared pages the round must write (`copy_pages`), run the one ragged
   decode round; one `copy_pages` and one `execute_prefill` for every chunk.
5. Decode: each decoding request appends its sampled token; EOS (checked first) or the length
   limit finishes it. Prefill: each chunk's tokens are computed; a chunk that completes its
   sequence samples the next token (and may finish it).
6. Requests that finished this step release their pages and state slots at its end.
7. With the automatic prefix cache (`prefix_caching`; `kvsched.spec.prefix_cache`): the pages
   this step completed were cached before those releases (after the model calls succeeded, so
   a cached page's KV is written), admissions (3) attached the longest cached run of their
   pages, and the step ends by evicting cached pages until `prefill_reserve_pages` are free, for
   the next step (a step never writes a page it freed, evicted ones included). Under pressure
   (2) eviction comes before reclaiming named prefixes and before preemption.

Atomicity: `submit` and `cancel` change nothing on error; a model failure inside `step` (typed
`BackendFailed`, or the round's identity errors) leaves the engine exactly as before the step,
so it can be retried: the plan and the commit are values and the engine never held them. With a
host tier, a step's new copies are started by its last call, one `start_copies` that starts all
or none (`kvsched.spec.model.CopyBackend`): once it returns they are the engine's state, and
when it raises none runs, so no copy the backend runs is one the engine forgot. A failing tier
degrades and never stalls: a page whose demotion failed is evicted, not demoted again, and a
failed host page is handed out last (`kvsched.spec.host_tier`).
Determinism: a request's tokens depend only on its own tokens (greedy), whether it ran alone,
batched, chunked, or was preempted and recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvsched.spec import host_tier, refusals
from kvsched.spec import pool as pool_ops
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.batch import RaggedBatchOutput
from kvsched.spec.domain import as_int, require_u64
from kvsched.spec.engine_calls import (
    NO_ANSWERS,
    Chunk,
    ModelAnswers,
    ModelCalls,
    chunk_pages,
    copier,
    issue_copies,
    plan_copies,
    poll_copies,
    run_model,
)
from kvsched.spec.engine_config import (
    EngineConfig,
    EngineRequest,
    StepOutput,
    admission_pages,
    finish_reason,
    fits,
    pages_for,
    salt_of,
)
from kvsched.spec.engine_state import (
    EngineState,
    Leased,
    Queued,
    Running,
    enqueue,
    external_holds,
    initial_engine,
    live_ids,
    prefill_order,
    sequence_of,
    victim,
    victim_order,
)
from kvsched.spec.errors import Exhausted, KvschedError
from kvsched.spec.host_tier import PROMOTE, HostState, HostStats
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.model import EngineModel, NullModel, PrefillItem
from kvsched.spec.page_keys import Key, page_hash, page_keys
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import BlockPool
from kvsched.spec.prefix import MAX_SET_PAGES, PrefixKvStore, PrefixPageSet, droppable
from kvsched.spec.prefix_cache import EMPTY_CACHE, CacheState, CacheStats
from kvsched.spec.round import commit_round, lower_round
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.sequence import FinishReason
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState


@dataclass(slots=True)
class StepRecord:
    """What a step has done so far (becomes its `StepOutput`)."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    finished: dict[int, FinishReason] = field(default_factory=dict)
    preempted: list[int] = field(default_factory=list)
    finishing: list[int] = field(default_factory=list)  # finished this step: released at its end
    tokens_run: int = 0
    # request id -> (start, stop): the positions whose KV this step wrote
    written: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step decided before the model runs: the engine after making room, preempting and
    admitting (no model call has changed it), the calls to make (None: the step only relieved
    pressure and runs nothing), its prefill chunks in call order, the cancellations and
    preemptions it reports, and the cache's counts before it."""

    state: EngineState
    calls: ModelCalls | None
    chunks: tuple[Chunk, ...]
    cancelled: tuple[int, ...]
    preempted: tuple[int, ...]
    stats: CacheStats
    host: HostStats


class Engine:
    """The continuous-batching engine over the spec's certified parts; see the module docstring."""

    def __init__(self, config: EngineConfig, model: EngineModel) -> None:
        if not isinstance(config, EngineConfig):
            raise refusals.wrong_kind("config", "EngineConfig", config)
        self.config = config
        self.model = model
        self.pool = BlockPool(config.pages)
        self.store = PrefixKvStore(config.prefix_entries, min(config.logical_pages, MAX_SET_PAGES), pool=self.pool)
        self.scheduler = RequestScheduler(
            config.requests, config.logical_pages, pool=self.pool, prefixes=self.store, page_size=config.page_size
        )
        self.digest = page_hash(config.page_hash)
        self.cache: CacheState = EMPTY_CACHE
        self.host: HostState = host_tier.initial_host(config.host_pages)
        self._leases: tuple[Leased, ...] = ()
        if config.host_pages:
            copier(model, required=True)
        self._restore(initial_engine(self._system(), config))

    # -- the state ----------------------------------------------------------------------------

    def _system(self) -> SystemState:
        external = external_holds(self.host, self._leases)
        return SystemState(self.pool.state, self.store.state, self.scheduler.state, external, self.cache)

    @property
    def state(self) -> EngineState:
        """The whole engine as a value."""
        return EngineState(
            self._system(),
            self._queue,
            self._running,
            self._state_slots,
            self._cancelled,
            self._admissions,
            self.host,
            self._leases,
        )

    def to_spec(self) -> EngineState:
        """The abstract state (the spec is its own abstraction)."""
        return self.state

    def _restore(self, state: EngineState) -> None:
        self.pool.commit(state.system.pool)
        self.store.commit(state.system.store)
        self.scheduler.commit(state.system.scheduler)
        self.cache = state.system.cache
        self._queue = state.queue
        self._running = state.running
        self._state_slots = state.state_slots
        self._cancelled = state.cancelled
        self._admissions = state.admissions
        self.host = state.host
        self._leases = state.leases

    # -- intake -------------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Queue `request` at the back of its priority class."""
        if not isinstance(request, EngineRequest):
            raise refusals.wrong_kind("request", "EngineRequest", request)
        if len(self._queue) >= self.config.max_queue:
            raise refusals.queue_full(request.request_id, len(self._queue))
        if request.request_id in self._cancelled:
            raise refusals.unreported_cancel(request.request_id)
        if request.request_id in live_ids(self.state):
            raise refusals.duplicate_request(request.request_id)
        why = fits(self.config, request)
        if why is not None:
            raise refusals.request_too_large(request.request_id, why)
        self._queue = enqueue(self._queue, Queued(request), front=False)

    def cancel(self, request_id: int) -> None:
        """Stop a queued or running request now; the next step reports it as CANCELLED. Its id
        is not free until then (`submit` and `fork` refuse it): a step reports an id once, so
        the CANCELLED is never read as a new request's under the same id."""
        request_id = require_u64("request_id", request_id)
        queued = [entry for entry in self._queue if entry.request.request_id == request_id]
        running = [entry for entry in self._running if entry.request.request_id == request_id]
        if not queued and not running:
            raise refusals.unknown_request(request_id)
        if running:
            self._release(running[0])
        self._queue = tuple(entry for entry in self._queue if entry.request.request_id != request_id)
        self._cancelled = (*self._cancelled, request_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        """Run `child_id` as a copy of the running request `parent_id` (parallel sampling): it
        shares every page, copy-on-write, and has the parent's tokens so far. It takes a batch
        seat and a state slot, and counts as the latest admitted (`Full` without a seat or a
        slot; `DuplicateRequest` for an id queued or running)."""
        parent_id = require_u64("parent_id", parent_id)
        child_id = require_u64("child_id", child_id)
        parent = next((entry for entry in self._running if entry.request.request_id == parent_id), None)
        if parent is None:
            raise refusals.unknown_request(parent_id)
        if child_id in self._cancelled:
            raise refusals.unreported_cancel(child_id)
        if child_id in live_ids(self.state):
            raise refusals.duplicate_request(child_id)
        if parent.waiting:
            raise refusals.copy_pending(parent_id, self._promoted_page(parent))
        slot = next((index for index, owner in enumerate(self._state_slots) if owner is None), None)
        if len(self._running) >= self.config.max_batch_size:
            raise refusals.batch_full(child_id, self.config.max_batch_size)
        if self._state_slots and slot is None:
            raise refusals.no_state_slot(child_id, len(self._state_slots))
        self.scheduler.fork(parent_id, child_id, self.pool)
        if slot is not None:
            self._state_slots = _with_owner(self._state_slots, slot, child_id)
        child = replace(parent, request=replace(parent.request, request_id=child_id), admitted=self._admissions)
        self._running = (*self._running, replace(child, state_slot=slot))
        self._admissions += 1

    def publish(self, request_id: int, tokens: int, identity: PrefixIdentity) -> None:
        """Publish the KV of a running request's first `tokens` tokens under `identity`: the
        store takes its own references to those pages, and a later request naming `identity`
        attaches them (`EngineRequest.prefix`). `identity` must name exactly those tokens."""
        request_id = require_u64("request_id", request_id)
        entry = self._readable(request_id)
        count = refusals.require_published_tokens(request_id, tokens, entry.computed)
        pages = self.scheduler.page_table(request_id)[: pages_for(count, self.config.page_size)]
        self.store.publish(PrefixPageSet(identity, tuple(page for page in pages if page is not None), count), self.pool)

    def lease(self, request_id: int) -> int:
        """An asynchronous reader holds the pages of the running request's written tokens (one
        reference each): they are never handed to another owner until `end_lease`, whatever
        happens to the request. The lease's id (the least unused). `CopyPending` while the
        request waits for copies from the host tier."""
        request_id = require_u64("request_id", request_id)
        entry = self._readable(request_id)
        table = self.scheduler.page_table(request_id)[: pages_for(entry.computed, self.config.page_size)]
        pages = tuple(page for page in table if page is not None)
        pool = self.pool.state
        for page in pages:
            pool = pool_ops.retain(pool, page)
        self.pool.commit(pool)
        ids = {lease.lease_id for lease in self._leases}
        lease_id = next(number for number in range(len(ids) + 1) if number not in ids)
        self._leases = tuple(sorted((*self._leases, Leased(lease_id, pages)), key=lambda lease: lease.lease_id))
        return lease_id

    def end_lease(self, lease_id: int) -> None:
        """The reader has read its pages: it lets go (`UnknownLease` for an id not held)."""
        number = as_int(lease_id)
        lease = next((lease for lease in self._leases if lease.lease_id == number), None)
        if lease is None:
            raise refusals.unknown_lease(lease_id)
        pool = self.pool.state
        for page in lease.pages:
            pool = pool_ops.release(pool, page)
        self.pool.commit(pool)
        self._leases = tuple(other for other in self._leases if other is not lease)

    def has_work(self) -> bool:
        """Something is queued or running, a cancellation is not yet reported, or a copy between
        the tiers is in flight."""
        return bool(self._queue or self._running or self._cancelled or self.host.copies)

    def reset_cache(self) -> None:
        """Drop every page of the automatic prefix cache and the host tier's cache; `CacheInUse`
        while any is held or a copy between the tiers is in flight."""
        if self.host.copies:
            raise refusals.cache_in_use(list(host_tier.device_holds(self.host)))
        cache, pool = cache_ops.reset(self.cache, self.pool.state)
        self.cache = cache
        self.pool.commit(pool)
        self.host = host_tier.reset(self.host)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One iteration (see the module docstring): `run_step` on the engine's state, which
        the engine then holds. On any error the engine is as before: it has not been touched."""
        state, output = run_step(self.state, self.config, self.model)
        self._restore(state)
        return output

    @classmethod
    def _working(cls, state: EngineState, config: EngineConfig) -> Engine:
        """Fresh spec objects holding `state`: where a step is planned and committed. Their
        model is never called (`run_model` makes a step's calls)."""
        work = cls(config, NullModel())
        work._restore(state)
        return work

    def _plan(self, done: dict[int, bool]) -> StepPlan:
        """Plan the step on this (working) engine: the copies `done` completed; room for the
        running requests (under pressure: relieve it, preempt, and plan nothing more), the
        decode round lowered, the admissions and every chunk's prefill item."""
        stats, host, cancelled = self.cache.stats, self.host.stats, self._cancelled
        self._cancelled = ()
        preempted: list[int] = []
        room = None if self._complete_copies(done, preempted) else self._make_room(preempted)
        if room is None:
            return StepPlan(self.state, None, (), cancelled, tuple(preempted), stats, host)
        plan, chunks = room
        items, tables = lower_round(self.scheduler.state, self.pool.state, self.config.page_size)
        budget = self.config.max_batched_tokens - len(items) - sum(chunk.length for chunk in chunks)
        while budget:
            chunk = self._admit(budget, chunks)
            if chunk is None:
                break
            if chunk.length:  # else it waits for its promotions
                chunks.append(chunk)
            budget -= chunk.length
        calls = ModelCalls(
            plan_copies(plan) if items else (),
            items,
            tables,
            tuple(pair for chunk in chunks for pair in chunk.copies),
            tuple(self._prefill_item(chunk) for chunk in chunks),
        )
        return StepPlan(self.state, calls, tuple(chunks), cancelled, tuple(preempted), stats, host)

    def _prefill_item(self, chunk: Chunk) -> PrefillItem:
        entry = self._entry(chunk.request_id)
        tokens = sequence_of(entry.request, entry.generated)[chunk.start : chunk.start + chunk.length]
        table = self.scheduler.page_table(chunk.request_id)
        return PrefillItem(chunk.request_id, self._slot_of(chunk.request_id), tokens, chunk.start, table)

    def _commit(self, plan: StepPlan, answers: ModelAnswers) -> StepOutput:
        """Commit a planned step's answers on this (working) engine: the round's tokens, the
        chunks' computed tokens and samples, the cache's new pages, the finished requests'
        release, and the end-of-step eviction."""
        record = StepRecord(
            finished=dict.fromkeys(plan.cancelled, FinishReason.CANCELLED), preempted=list(plan.preempted)
        )
        if plan.calls is not None:
            self._take_round(answers.outputs, record)
            self._take_prefills(plan.chunks, answers.sampled, record)
            self._publish_written(record)
            for request_id in record.finishing:
                self._release(self._entry(request_id))
        self._evict(self.config.prefill_reserve_pages - self.pool.free_count())
        return StepOutput(
            tokens={request_id: tuple(tokens) for request_id, tokens in record.tokens.items()},
            finished=record.finished,
            preempted=tuple(record.preempted),
            tokens_run=record.tokens_run,
            pages_in_use=self.config.pages - self.pool.free_count(),
            cache=self.cache.stats - plan.stats,
            host=self.host.stats - plan.host,
        )

    def _make_room(self, preempted: list[int]) -> tuple[WritePlan, list[Chunk]] | None:
        """Room for every running request's work this step: the decode plan and the running
        prefills' chunks. Under pressure, reclaim idle prefixes, then preempt victims, until it
        all fits, and then do nothing more this step (None): the step that freed pages never
        writes them, so a model failure can always be undone."""
        relieved = False
        while True:
            inner = self.state
            try:
                room = self._room_for_running()
            except Exhausted as error:
                self._restore(inner)
                relieved_now = self._relieve(error.needed or 1)
                if relieved_now == 0 and self.host.copies:
                    return None  # copies in flight free or unpin pages when they complete: wait
                if relieved_now == 0 and not self._drop_for_the_last():
                    entry = victim(self._running)
                    if entry is None:
                        raise
                    self._preempt(entry, preempted)
                relieved = True
                continue
            if relieved:
                self._restore(inner)
                return None
            return room

    def _room_for_running(self) -> tuple[WritePlan, list[Chunk]]:
        plan = self.scheduler.prepare_decode_round(self.pool, self.config.page_size)
        budget = self.config.max_batched_tokens - sum(1 for entry in self._running if entry.decoding)
        chunks = []
        for entry in sorted((entry for entry in self._running if not entry.decoding), key=prefill_order):
            if entry.waiting:
                continue  # it computes nothing until its promotions complete
            if budget == 0:
                break
            request_id = entry.request.request_id
            length = min(self.config.chunk_size, entry.sequence_length - entry.computed, budget)
            room = self.scheduler.record_chunk(request_id, length, self.pool)  # made room for and counted
            chunks.append(Chunk(request_id, entry.computed, length, plan_copies(room)))
            budget -= length
        return plan, chunks

    def _take_round(self, outputs: tuple[RaggedBatchOutput, ...], record: StepRecord) -> None:
        """The decode round's checked outputs: each request consumes its token and samples one."""
        if not outputs:
            return
        self.scheduler.commit(commit_round(self.scheduler.state, list(outputs)))
        record.tokens_run += len(outputs)
        for output in outputs:
            entry = self._entry(output.request_id)
            record.written[output.request_id] = (entry.computed, entry.computed + 1)
            self._emit(entry, output.next_token_id, record)

    def _admit(self, budget: int, chunks: list[Chunk]) -> Chunk | None:
        """Admit the queue's front request with its first chunk, if everything it needs is
        free now; None when not (nobody is preempted for a newcomer; idle prefixes are reclaimed
        for it, and it is admitted by a later step)."""
        if not self._queue or len(self._running) >= self.config.max_batch_size:
            return None
        free = self.pool.free_count()
        if free < self.config.prefill_reserve_pages and self._running:
            return None  # the memory guard; an empty batch is never starved
        slot = next((index for index, owner in enumerate(self._state_slots) if owner is None), None)
        if self._state_slots and slot is None:
            return None
        front = self._queue[0]
        request = front.request
        length_of = len(request.prompt) + len(front.generated)
        page_size = self.config.page_size
        identity, cached = self._usable_prefix(request.prefix, length_of, budget)
        keys = self._cache_keys(request, sequence_of(request, front.generated), cached)
        hit = cache_ops.lookup(self.cache, keys)
        fetch = host_tier.run(self.host, keys[len(hit) :]) if identity is None else ()
        cached += len(hit) * page_size
        fetched = len(fetch) * page_size
        length = min(self.config.chunk_size, length_of - cached - fetched, budget)
        pages = chunk_pages(cached + fetched, length, page_size)
        needed = max(len(fetch) + len(pages), self._admission_pages(length_of, cached, chunks))
        if needed > free:
            self._relieve(needed, keep=hit)  # for a later step: this one writes no freed page
            return None
        request_id = request.request_id
        admission = self.scheduler.admit_with_prefix(request_id, identity, self.store, self.pool)
        if self.config.prefix_caching:
            if hit:
                self.scheduler.attach_pages(request_id, hit, self.pool)
            self.cache = cache_ops.count_query(self.cache, length_of, len(hit) * page_size)
        waiting: tuple[int, ...] = ()
        if fetch:  # fresh pages for the host run, counted; it waits for their promotions
            self.scheduler.record_chunk(request_id, fetched, self.pool)
            waiting = self._promote(request_id, fetch, cached // page_size)
            plan, length = None, 0
        elif admission.prefix_tokens + len(hit) * page_size == cached:
            plan = self.scheduler.record_chunk(request_id, length, self.pool)
        else:  # a full hit recomputes its last prompt token, which the prefix already counts
            plan = self.scheduler.ensure_writable_batch([request_id] * len(pages), pages, self.pool)
        if slot is not None:
            self._state_slots = _with_owner(self._state_slots, slot, request_id)
        entry = Running(request, front.generated, cached + fetched, False, self._admissions, slot, waiting)
        self._admissions += 1
        self._running = (*self._running, entry)
        self._queue = self._queue[1:]
        return Chunk(request_id, cached + fetched, length, () if plan is None else plan_copies(plan))

    def _admission_pages(self, length: int, cached: int, chunks: list[Chunk]) -> int:
        """What the admission policy asks to be free for a newcomer besides its first chunk's
        pages (`admission_pages`): the running prefills still need pages for their tokens past
        this step's `chunks` (whose pages are taken). Nothing while nobody runs: an empty batch
        is never starved."""
        if not self._running:
            return 0
        page_size = self.config.page_size
        recorded = {chunk.request_id: chunk.start + chunk.length for chunk in chunks}
        committed = sum(
            pages_for(entry.sequence_length, page_size)
            - pages_for(recorded.get(entry.request.request_id, entry.computed), page_size)
            for entry in self._running
            if not entry.decoding
        )
        return admission_pages(self.config, length, cached, committed)

    def _usable_prefix(
        self, identity: PrefixIdentity | None, length: int, budget: int
    ) -> tuple[PrefixIdentity | None, int]:
        """The prefix to attach and the tokens it saves: published, no longer than the sequence,
        and leaving a rest that one chunk completes; a full hit still recomputes one token."""
        page_set = None if identity is None else self.store.get(identity)
        if page_set is None or page_set.token_count > length:
            return None, 0
        cached = min(page_set.token_count, length - 1)
        if length - cached > min(self.config.chunk_size, budget):
            return None, 0
        return identity, cached

    def _cache_keys(self, request: EngineRequest, sequence: tuple[int, ...], start: int) -> tuple[Key, ...]:
        """The keys of the sequence's full pages from token `start` (a page boundary, else
        none), at most up to the last page before its last token (which is always computed,
        so a full hit still prefills a token): what the caches are looked up by."""
        page_size = self.config.page_size
        if not self.config.prefix_caching or start % page_size:
            return ()
        pages = (len(sequence) - 1) // page_size
        keys = page_keys(sequence, page_size, salt_of(self.config, request), self.digest, pages)
        return tuple(keys[start // page_size :])

    def _take_prefills(self, chunks: tuple[Chunk, ...], sampled: tuple[int, ...], record: StepRecord) -> None:
        """Each chunk's tokens are computed; one that completes its sequence samples."""
        for chunk, token in zip(chunks, sampled, strict=True):
            entry = self._entry(chunk.request_id)
            record.written[chunk.request_id] = (chunk.start, chunk.start + chunk.length)
            computed = chunk.start + chunk.length
            record.tokens_run += chunk.length
            entry = self._replace(entry, computed=computed)
            if computed == entry.sequence_length:
                self._emit(entry, token, record)

    def _slot_of(self, request_id: int) -> int:
        return next(
            index
            for index, slot in enumerate(self.scheduler.state.slots)
            if slot.state is not RequestState.EMPTY and slot.request_id == request_id
        )

    # -- what happens to a running request ----------------------------------------------------

    def _emit(self, entry: Running, token: int, record: StepRecord) -> None:
        """Append the token `entry` sampled; finish it, or make it (keep it) decoding."""
        request_id = entry.request.request_id
        generated = (*entry.generated, token)
        record.tokens.setdefault(request_id, []).append(token)
        reason = finish_reason(entry.request, generated)
        if reason is not None:
            record.finished[request_id] = reason
            record.finishing.append(request_id)  # released at the end of the step
            return
        if not entry.decoding:
            if self.scheduler.state.slots[self._slot_of(request_id)].state is RequestState.PREFILL:
                self.scheduler.mark_prefill_complete(request_id)
            self.scheduler.seed_decode_token(request_id, token)
        self._replace(entry, generated=generated, computed=entry.sequence_length, decoding=True)

    def _replace(self, entry: Running, **changes: object) -> Running:
        new = replace(entry, **changes)  # type: ignore[arg-type]
        self._running = tuple(new if other is entry else other for other in self._running)
        return new

    def _release(self, entry: Running) -> None:
        """Finish `entry` in the scheduler (pages released; the cached ones stamped as used now)
        and free its state slot."""
        if self.config.prefix_caching:
            table = self.scheduler.page_table(entry.request.request_id)
            self.cache = cache_ops.stamp(self.cache, [page for page in table if page is not None])
        self.scheduler.finish(entry.request.request_id, self.pool)
        if entry.state_slot is not None:
            self._state_slots = _with_owner(self._state_slots, entry.state_slot, None)
        self._running = tuple(other for other in self._running if other is not entry)

    def _preempt(self, entry: Running, preempted: list[int]) -> None:
        """Release `entry` and requeue it at the front of its class, its tokens kept."""
        self._release(entry)
        self._queue = enqueue(self._queue, Queued(entry.request, entry.generated), front=True)
        preempted.append(entry.request.request_id)

    # -- the automatic prefix cache ----------------------------------------------------------

    def _publish_written(self, record: StepRecord) -> None:
        """Cache every page this step completed, now that its KV is written: each request's full
        pages that end inside the positions this step wrote (finishing requests included)."""
        if not self.config.prefix_caching:
            return
        page_size = self.config.page_size
        for entry in self._running:
            request_id = entry.request.request_id
            start, stop = record.written.get(request_id, (0, 0))
            first, end = start // page_size, stop // page_size
            if first == end:
                continue
            sequence = sequence_of(entry.request, entry.generated)
            keys = page_keys(sequence, page_size, salt_of(self.config, entry.request), self.digest, end)
            table = self.scheduler.page_table(request_id)
            for depth in range(first, end):
                page = table[depth]
                assert page is not None
                self.cache, pool = cache_ops.insert(self.cache, self.pool.state, keys[depth], page, depth)
                self.pool.commit(pool)

    def _evict(self, pages: int, keep: tuple[int, ...] = ()) -> int:
        """Evict up to `pages` cached pages held by the cache alone (not those in `keep`), in
        eviction order; with a host tier, each the host wants is demoted instead (its copy holds
        it, still cached, until it completes; a page whose demotion failed is refused, so it is
        evicted). How many were evicted or demoted."""
        if pages <= 0 or not self.config.prefix_caching:
            return 0
        demoted = 0
        if self.host.pages:
            kept = set(keep)
            victims = [entry for entry in cache_ops.evictable(self.cache, self.pool.state) if entry.page not in kept]
            for entry in victims[:pages]:
                if host_tier.wants(self.host, entry.page, entry.key):
                    self.pool.retain(entry.page)  # the copy's hold
                    self.host = host_tier.demote(self.host, entry.page, entry.key, entry.depth)
                    demoted += 1
        self.cache, pool, evicted = cache_ops.evict(self.cache, self.pool.state, pages - demoted, keep)
        self.pool.commit(pool)
        if evicted and self.host.refused:
            self.host = host_tier.keep_refused(self.host, {entry.page for entry in self.cache.pages})
        return demoted + evicted

    # -- the host tier ------------------------------------------------------------------------

    def _promote(self, request_id: int, fetch: tuple[host_tier.HostPage, ...], first: int) -> tuple[int, ...]:
        """Copy the host pages `fetch` into the request's pages from logical page `first` (each
        held by its copy); the copies' ids."""
        table = self.scheduler.page_table(request_id)
        waiting = []
        for depth, entry in enumerate(fetch, start=first):
            page = table[depth]
            assert page is not None
            self.pool.retain(page)  # the copy's hold
            self.host, transfer_id = host_tier.promote(self.host, entry, page, request_id)
            waiting.append(transfer_id)
        self.host = host_tier.count_hit(self.host, len(fetch) * self.config.page_size)
        return tuple(waiting)

    def _complete_copies(self, done: dict[int, bool], preempted: list[int]) -> bool:
        """Apply the copies `done` reports, in issue order (see `kvsched.spec.host_tier`): a
        promotion that completed joins the device cache and its request waits for one copy
        fewer; one that failed preempts its request (it recomputes). Whether any was preempted
        (then the step runs nothing)."""
        failed: list[int] = []
        for copy in self.host.copies:
            ok = done.get(copy.transfer_id)
            if ok is None:
                continue
            if copy.kind == PROMOTE and ok:
                self.cache, pool = cache_ops.insert(self.cache, self.pool.state, copy.key, copy.page, copy.depth)
                self.pool.commit(pool)
            self.pool.release(copy.page)
            self.host = host_tier.complete(self.host, copy, ok)
            entry = self._waiting_on(copy.request_id, copy.transfer_id)
            if entry is not None and ok:
                self._replace(entry, waiting=tuple(tid for tid in entry.waiting if tid != copy.transfer_id))
            elif entry is not None and copy.request_id not in failed:
                failed.append(entry.request.request_id)
        for entry in sorted(map(self._entry, failed), key=victim_order):  # the latest first: places kept
            self._preempt(entry, preempted)
        return bool(failed)

    def _waiting_on(self, request_id: int | None, transfer_id: int) -> Running | None:
        """The running request waiting for copy `transfer_id`, if any."""
        return next((e for e in self._running if e.request.request_id == request_id and transfer_id in e.waiting), None)

    def _readable(self, request_id: int) -> Running:
        """The running request `request_id`, once every page of its written tokens holds their
        KV (it waits for no copy from the host tier); else `UnknownRequest` or `CopyPending`."""
        entry = next((entry for entry in self._running if entry.request.request_id == request_id), None)
        if entry is None:
            raise refusals.unknown_request(request_id)
        if entry.waiting:
            raise refusals.copy_pending(request_id, self._promoted_page(entry))
        return entry

    def _promoted_page(self, entry: Running) -> int:
        """A page `entry` waits for."""
        return next(copy.page for copy in self.host.copies if copy.transfer_id in entry.waiting)

    def _relieve(self, pages: int, keep: tuple[int, ...] = ()) -> int:
        """Free pages toward `pages` free for a later step: evict cached pages, else reclaim
        idle named prefixes (counting the cache's references, but for those in `keep`, as
        idle); how many it freed or left evictable."""
        evicted = self._evict(max(pages - self.pool.free_count(), 1), keep)
        if evicted:
            return evicted
        spare = cache_ops.get_cache_references(self.cache)
        return self.store.reclaim(self.pool, pages, spare, keep)  # `keep`: reused, so never counted freed

    def _drop_for_the_last(self) -> bool:
        """With one request left to preempt, remove a published prefix that alone holds a page it
        shares others with the request (`droppable`), if there is one. Preempting the last
        request would not help it: readmitted alone, it would meet the same pages held, forever."""
        if len(self._running) != 1:
            return False
        cached = cache_ops.get_cache_references(self.cache)
        identity = droppable(self.store.state, self.pool.state, cached)
        return identity is not None and self.store.remove(identity, self.pool)

    def _entry(self, request_id: int) -> Running:
        return next(entry for entry in self._running if entry.request.request_id == request_id)


def plan_step(state: EngineState, config: EngineConfig, done: dict[int, bool] | None = None) -> StepPlan:
    """The step `state` takes, decided before any model call (see the module docstring), once
    the copies `done` reports have completed."""
    return Engine._working(state, config)._plan(done or {})


def commit_step(plan: StepPlan, answers: ModelAnswers, config: EngineConfig) -> tuple[EngineState, StepOutput]:
    """The engine after a planned step whose model calls answered `answers`, and its output."""
    work = Engine._working(plan.state, config)
    output = work._commit(plan, answers)
    return work.state, output


def run_step(state: EngineState, config: EngineConfig, model: EngineModel) -> tuple[EngineState, StepOutput]:
    """One step as a function on values: plan it, make its model calls, commit their answers.
    Whatever it raises, `state` is a value and so unchanged: a failed step is undone by
    keeping the state the caller already has."""
    done = poll_copies(copier(model), state.host.copies)
    plan = plan_step(state, config, done)
    answers = NO_ANSWERS if plan.calls is None else run_model(plan.calls, model)
    after, output = commit_step(plan, answers, config)
    issue_copies(copier(model), [copy for copy in after.host.copies if copy.transfer_id >= state.host.issued])
    return after, output


def _with_owner(slots: tuple[int | None, ...], index: int, owner: int | None) -> tuple[int | None, ...]:
    return slots[:index] + (owner,) + slots[index + 1 :]


__all__ = ["Engine", "EngineConfig", "EngineRequest", "KvschedError", "StepOutput"]
