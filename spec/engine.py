"""The continuous-batching engine: intake, one step at a time, preemption by recompute.

`Engine(config, model)` holds one value, an `EngineState`: the certified parts' states (pool,
prefix store, request scheduler) and the engine's own. It is wiring and a policy over parts, each
in its own module and changing an operation's `Work` (`kvsched.spec.engine_work`): the running
requests and their chunks (`engine_running`), the admission policy (`engine_admission`), the
automatic prefix cache and pressure relief (`engine_cache`), the host tier (`engine_host`, over
`kvsched.spec.host_tier`) and the leases (`engine_leases`). It runs the loop an inference engine
runs every iteration:

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
    take_events()    the KV events since the last batch, for a router (`engine_events`); and
    snapshot()       what they published so far, for a router that missed a batch

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

from dataclasses import dataclass, replace

from kvsched.spec import host_tier, refusals
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_admission import admit
from kvsched.spec.engine_cache import drop_for_the_last, evict, publish_written, relieve
from kvsched.spec.engine_calls import (
    NO_ANSWERS,
    Chunk,
    ModelAnswers,
    ModelCalls,
    copier,
    issue_copies,
    plan_copies,
    poll_copies,
    run_model,
)
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput, fits, pages_for
from kvsched.spec.engine_events import Publisher, cached_entries
from kvsched.spec.engine_host import complete_copies, promoted_page, readable
from kvsched.spec.engine_leases import end, take
from kvsched.spec.engine_running import (
    StepRecord,
    preempt,
    prefill_item,
    release,
    room_for_running,
    take_prefills,
    take_round,
)
from kvsched.spec.engine_state import EngineState, Queued, enqueue, live_ids, victim
from kvsched.spec.engine_work import Work
from kvsched.spec.errors import Exhausted, KvschedError
from kvsched.spec.host_tier import HostState, HostStats
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.kv_events import EventBatch, Snapshot
from kvsched.spec.model import EngineModel
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import BlockPool
from kvsched.spec.prefix import PrefixPageSet
from kvsched.spec.prefix_cache import CacheState, CacheStats
from kvsched.spec.round import lower_round
from kvsched.spec.sequence import FinishReason


class Engine:
    """The continuous-batching engine over the spec's certified parts; see the module docstring.
    It holds an `EngineState` and nothing else that changes: every operation works on a `Work`
    opened on it and takes the work's state once the operation succeeded."""

    def __init__(self, config: EngineConfig, model: EngineModel, *, name: str = "engine", epoch: int = 0) -> None:
        if not isinstance(config, EngineConfig):
            raise refusals.wrong_kind("config", "EngineConfig", config)
        self.config = config
        self.model = model
        self.events = Publisher(name, epoch, config.page_size)  # its KV events, as `name` in restart `epoch`
        if config.host_pages:
            copier(model, required=True)
        self._state = Work.initial(config)

    @property
    def state(self) -> EngineState:
        """The whole engine as a value."""
        return self._state

    def to_spec(self) -> EngineState:
        """The abstract state (the spec is its own abstraction)."""
        return self._state

    def _work(self) -> Work:
        return Work.of(self._state, self.config)

    @property
    def pool(self) -> BlockPool:
        """The pool, to read: a `BlockPool` holding the engine's pool state now (a copy: the
        engine changes only through its operations)."""
        return self._work().pool

    @property
    def cache(self) -> CacheState:
        """The automatic prefix cache's state."""
        return self._state.system.cache

    @property
    def host(self) -> HostState:
        """The host tier's state."""
        return self._state.host

    # -- intake -------------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Queue `request` at the back of its priority class."""
        if not isinstance(request, EngineRequest):
            raise refusals.wrong_kind("request", "EngineRequest", request)
        state = self._state
        if len(state.queue) >= self.config.max_queue:
            raise refusals.queue_full(request.request_id, len(state.queue))
        if request.request_id in state.cancelled:
            raise refusals.unreported_cancel(request.request_id)
        if request.request_id in live_ids(state):
            raise refusals.duplicate_request(request.request_id)
        why = fits(self.config, request)
        if why is not None:
            raise refusals.request_too_large(request.request_id, why)
        self._state = replace(state, queue=enqueue(state.queue, Queued(request), front=False))

    def cancel(self, request_id: int) -> None:
        """Stop a queued or running request now; the next step reports it as CANCELLED. Its id
        is not free until then (`submit` and `fork` refuse it): a step reports an id once, so
        the CANCELLED is never read as a new request's under the same id."""
        request_id = require_u64("request_id", request_id)
        work = self._work()
        queued = [entry for entry in work.queue if entry.request.request_id == request_id]
        running = work.find(request_id)
        if not queued and running is None:
            raise refusals.unknown_request(request_id)
        if running is not None:
            release(work, running)
        work.queue = tuple(entry for entry in work.queue if entry.request.request_id != request_id)
        work.cancelled = (*work.cancelled, request_id)
        self._state = work.state

    def fork(self, parent_id: int, child_id: int) -> None:
        """Run `child_id` as a copy of the running request `parent_id` (parallel sampling): it
        shares every page, copy-on-write, and has the parent's tokens so far. It takes a batch
        seat and a state slot, and counts as the latest admitted (`Full` without a seat or a
        slot; `DuplicateRequest` for an id queued or running)."""
        parent_id = require_u64("parent_id", parent_id)
        child_id = require_u64("child_id", child_id)
        work = self._work()
        parent = work.find(parent_id)
        if parent is None:
            raise refusals.unknown_request(parent_id)
        if child_id in work.cancelled:
            raise refusals.unreported_cancel(child_id)
        if child_id in live_ids(self._state):
            raise refusals.duplicate_request(child_id)
        if parent.waiting:
            raise refusals.copy_pending(parent_id, promoted_page(work, parent))
        slot = work.free_state_slot()
        if len(work.running) >= self.config.max_batch_size:
            raise refusals.batch_full(child_id, self.config.max_batch_size)
        if work.state_slots and slot is None:
            raise refusals.no_state_slot(child_id, len(work.state_slots))
        work.scheduler.fork(parent_id, child_id, work.pool)
        if slot is not None:
            work.own_state_slot(slot, child_id)
        child = replace(parent, request=replace(parent.request, request_id=child_id), admitted=work.admissions)
        work.running = (*work.running, replace(child, state_slot=slot))
        work.admissions += 1
        self._state = work.state

    def publish(self, request_id: int, tokens: int, identity: PrefixIdentity) -> None:
        """Publish the KV of a running request's first `tokens` tokens under `identity`: the
        store takes its own references to those pages, and a later request naming `identity`
        attaches them (`EngineRequest.prefix`). `identity` must name exactly those tokens."""
        request_id = require_u64("request_id", request_id)
        work = self._work()
        entry = readable(work, request_id)
        count = refusals.require_published_tokens(request_id, tokens, entry.computed)
        pages = work.scheduler.page_table(request_id)[: pages_for(count, self.config.page_size)]
        work.store.publish(PrefixPageSet(identity, tuple(page for page in pages if page is not None), count), work.pool)
        self._state = work.state

    def lease(self, request_id: int) -> int:
        """An asynchronous reader holds the pages of the running request's written tokens (one
        reference each): they are never handed to another owner until `end_lease`, whatever
        happens to the request. The lease's id (the least unused). `CopyPending` while the
        request waits for copies from the host tier."""
        request_id = require_u64("request_id", request_id)
        work = self._work()
        entry = readable(work, request_id)
        table = work.scheduler.page_table(request_id)[: pages_for(entry.computed, self.config.page_size)]
        lease_id = take(work, tuple(page for page in table if page is not None))
        self._state = work.state
        return lease_id

    def end_lease(self, lease_id: int) -> None:
        """The reader has read its pages: it lets go (`UnknownLease` for an id not held)."""
        work = self._work()
        end(work, lease_id)
        self._state = work.state

    def has_work(self) -> bool:
        """Something is queued or running, a cancellation is not yet reported, or a copy between
        the tiers is in flight."""
        state = self._state
        return bool(state.queue or state.running or state.cancelled or state.host.copies)

    def reset_cache(self) -> None:
        """Drop every page of the automatic prefix cache and the host tier's cache; `CacheInUse`
        while any is held or a copy between the tiers is in flight."""
        work = self._work()
        if work.host.copies:
            raise refusals.cache_in_use(list(host_tier.device_holds(work.host)))
        work.cache, pool = cache_ops.reset(work.cache, work.pool.state)
        work.pool.commit(pool)
        work.host = host_tier.reset(work.host)
        self._state = work.state
        self.events.reset()

    def take_events(self) -> EventBatch | None:
        """The KV events since the last batch (None: the cached set has not changed)."""
        return self.events.take(cached_entries(self._state))

    def snapshot(self) -> Snapshot:
        """The cached set the batches so far published."""
        return self.events.snapshot()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One iteration (see the module docstring): `run_step` on the engine's state, which
        the engine then holds. On any error the engine is as before: it has not been touched."""
        self._state, output = run_step(self._state, self.config, self.model)
        return output


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step decided before the model runs: the engine after making room, preempting and
    admitting (no model call has changed it), the calls to make (None: the step only relieved
    pressure and runs nothing), its prefill chunks in call order, the cancellations and
    preemptions it reports, and the cache's and host tier's counts before it."""

    state: EngineState
    calls: ModelCalls | None
    chunks: tuple[Chunk, ...]
    cancelled: tuple[int, ...]
    preempted: tuple[int, ...]
    stats: CacheStats
    host: HostStats


def plan_step(state: EngineState, config: EngineConfig, done: dict[int, bool] | None = None) -> StepPlan:
    """The step `state` takes, decided before any model call (see the module docstring), once
    the copies `done` reports have completed: room for the running requests (under pressure:
    relieve it, preempt, and plan nothing more), the decode round lowered, the admissions and
    every chunk's prefill item."""
    work = Work.of(state, config)
    stats, host, cancelled = work.cache.stats, work.host.stats, work.cancelled
    work.cancelled = ()
    preempted: list[int] = []
    room = None if complete_copies(work, done or {}, preempted) else make_room(work, preempted)
    if room is None:
        return StepPlan(work.state, None, (), cancelled, tuple(preempted), stats, host)
    plan, chunks = room
    items, tables = lower_round(work.scheduler.state, work.pool.state, config.page_size)
    budget = config.max_batched_tokens - len(items) - sum(chunk.length for chunk in chunks)
    while budget:
        chunk = admit(work, budget, chunks)
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
        tuple(prefill_item(work, chunk) for chunk in chunks),
    )
    return StepPlan(work.state, calls, tuple(chunks), cancelled, tuple(preempted), stats, host)


def make_room(work: Work, preempted: list[int]) -> tuple[WritePlan, list[Chunk]] | None:
    """Room for every running request's work this step: the decode plan and the running
    prefills' chunks. Under pressure, reclaim idle prefixes, then preempt victims, until it all
    fits, and then do nothing more this step (None): the step that freed pages never writes
    them, so a model failure can always be undone."""
    relieved = False
    while True:
        before = work.state
        try:
            room = room_for_running(work)
        except Exhausted as error:
            work.reopen(before)  # the try is dropped
            relieved_now = relieve(work, error.needed or 1)
            if relieved_now == 0 and work.host.copies:
                return None  # copies in flight free or unpin pages when they complete: wait
            if relieved_now == 0 and not drop_for_the_last(work):
                entry = victim(work.running)
                if entry is None:
                    raise
                preempt(work, entry, preempted)
            relieved = True
            continue
        if relieved:
            work.reopen(before)
            return None
        return room


def commit_step(plan: StepPlan, answers: ModelAnswers, config: EngineConfig) -> tuple[EngineState, StepOutput]:
    """The engine after a planned step whose model calls answered `answers`, and its output:
    the round's tokens, the chunks' computed tokens and samples, the cache's new pages, the
    finished requests' release, and the end-of-step eviction."""
    work = Work.of(plan.state, config)
    record = StepRecord(finished=dict.fromkeys(plan.cancelled, FinishReason.CANCELLED), preempted=list(plan.preempted))
    if plan.calls is not None:
        take_round(work, answers.outputs, record)
        take_prefills(work, plan.chunks, answers.sampled, record)
        publish_written(work, record)
        for request_id in record.finishing:
            release(work, work.entry(request_id))
    evict(work, config.prefill_reserve_pages - work.pool.free_count())
    output = StepOutput(
        tokens={request_id: tuple(tokens) for request_id, tokens in record.tokens.items()},
        finished=record.finished,
        preempted=tuple(record.preempted),
        tokens_run=record.tokens_run,
        pages_in_use=config.pages - work.pool.free_count(),
        cache=work.cache.stats - plan.stats,
        host=work.host.stats - plan.host,
    )
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


__all__ = ["Engine", "EngineConfig", "EngineRequest", "KvschedError", "StepOutput"]
