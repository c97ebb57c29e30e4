"""The continuous-batching engine over impl's certified parts: the spec's `Engine`, built for speed.

Same operations, outputs, errors and order as `kvsched.spec.engine` (read it for the step), over
`kvsched.impl`'s pool, store and scheduler. Each running request lives in its scheduler slot's
row of fixed arrays (`kvsched.impl.engine_rows`), so a decode step appends every token and finds
every finished request in one kernel call, and `StepOutput.tokens` is a lazy mapping over the
round's output arrays. The engine is wiring and the step over parts: the running requests, the
queue, the page keys and the leases hold their own state and `to_spec` (`engine_running`,
`engine_queue`, `engine_keys`, `engine_leases`); the admission policy (`engine_admission`), the
cache's policy and the relief of pressure (`engine_cache`), the copies between the tiers
(`engine_host`) and the batch's work (`engine_batch`) change them. The step has the spec's
shape: plan (`_plan`), the model's calls (`Batch.run_model`), commit (`_commit`), then the
copies it started (its last call).

Atomicity, with no checkpoint: the plan only takes pages (its room, `Batch.room`, and its
admissions, `Admission.admit`; a shortfall's relief, the copies reported done and the planned
promotions are the commit's). If a model call fails, `Batch.undo_room` takes the plan back
exactly (each page back in its place on the free stack), the cache's journal its lookups'
counts and the queue its pops. After the model calls a step stands: copies the model cannot
start fail (`_start_copies`). The cancellations a step reports are cleared once it succeeded.
`to_spec()` is the abstraction function to the spec's `EngineState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from kvsched.impl.engine_admission import Admission
from kvsched.impl.engine_batch import Batch, StepPlan, StepTokens
from kvsched.impl.engine_cache import CachePolicy
from kvsched.impl.engine_events import CachePublisher
from kvsched.impl.engine_host import HostCopies
from kvsched.impl.engine_keys import PageKeys
from kvsched.impl.engine_leases import Leases
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_rows import COMPUTED
from kvsched.impl.engine_running import Record, RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import Mark, PrefixCache
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.writes import ArrayWritePlan
from kvsched.spec import refusals
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_calls import Chunk, copier, issue_copies, poll_copies
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput, pages_for
from kvsched.spec.engine_state import EngineState, Queued, external_holds
from kvsched.spec.errors import BackendFailed, Exhausted
from kvsched.spec.host_tier import Copy
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.kv_events import EventBatch, Snapshot
from kvsched.spec.model import EngineModel
from kvsched.spec.prefix import MAX_SET_PAGES, PrefixPageSet
from kvsched.spec.sequence import FinishReason
from kvsched.spec.system import SystemState


class Engine:
    """The continuous-batching engine over impl's parts; see `kvsched.spec.engine`."""

    # Everything the engine holds, and how a failed step leaves it as it was (a test requires
    # every attribute here).
    ON_FAILURE: ClassVar[Mapping[str, str]] = {
        "_cancelled": "cleared by a step only once it has succeeded",
        "config": "never changes",
        "model": "never changes",
        "pool": "a certified part: the plan's pages put back in place, the latest first",
        "store": "a certified part: the admissions' recency put back",
        "scheduler": "a certified part: the room and the admissions taken back",
        "cache": "its journal: its lookups' counts put back (the plan changes nothing else)",
        "host": "the plan changes nothing: completions and promotions are the commit's",
        "running": "a part: the admissions' rows let go (the plan writes no other row)",
        "keys": "a part: a slot's keys name its tokens; a failed admission's are replaced by the slot's next",
        "queue": "a part: marked when a step begins, it copies itself when the step first changes it",
        "leases": "a part changed by lease and end_lease only, never by a step",
        "cache_policy": "a part with no state of its own",
        "host_copies": "a part with no state of its own",
        "admission": "a part whose state is one step's, set before it is read; its admissions taken back",
        "batch": "a part: its round's output buffers, and the room a step took, which a failed step takes back",
        "events": "the publisher reads the caches between steps; a failed step changed nothing it reads",
    }

    def __init__(self, config: EngineConfig, model: EngineModel, *, name: str = "engine", epoch: int = 0) -> None:
        if not isinstance(config, EngineConfig):
            raise refusals.wrong_kind("config", "EngineConfig", config)
        self.config = config
        self.model = model
        self.pool = BlockPool(config.pages)
        self.store = PrefixKvStore(config.prefix_entries, min(config.logical_pages, MAX_SET_PAGES), pool=self.pool)
        self.scheduler = RequestScheduler(
            config.requests, config.logical_pages, pool=self.pool, prefixes=self.store, page_size=config.page_size
        )
        self.running = RunningSet(config)
        self.queue = WaitingQueue()
        self._cancelled: list[int] = []
        self.cache = PrefixCache(config.pages)
        self.keys = PageKeys(config, self.running.tokens)
        self.host = HostTier(config.host_pages)
        self.events = CachePublisher(name, epoch, config.page_size, self.cache, self.host)
        self.leases = Leases()
        self.cache_policy = CachePolicy(
            config, self.pool, self.store, self.scheduler, self.cache, self.host, self.keys, self.running
        )
        self.host_copies = HostCopies(config.page_size, self.pool, self.cache, self.host, self.running)
        self.admission = Admission(
            config, self.scheduler, self.store, self.queue, self.running, self.keys, self.cache_policy, self.host_copies
        )
        self.batch = Batch(
            config, model, self.scheduler, self.queue, self.running, self.keys, self.admission, self.host_copies
        )
        if config.host_pages:
            copier(model, required=True)

    # -- the abstraction ----------------------------------------------------------------------

    def to_spec(self) -> EngineState:
        """The abstraction function: this engine as the spec's `EngineState`."""
        system = SystemState(
            self.pool.to_spec(),
            self.store.to_spec(),
            self.scheduler.to_spec(),
            external_holds(self.host.to_spec(), self.leases.to_spec()),
            self.cache.to_spec(),
        )
        running, state_slots, admissions = self.running.to_spec()
        return EngineState(
            system,
            self.queue.to_spec(),
            running,
            state_slots,
            tuple(self._cancelled),
            admissions,
            self.host.to_spec(),
            self.leases.to_spec(),
        )

    @property
    def state(self) -> EngineState:
        """The abstract state (`to_spec()`)."""
        return self.to_spec()

    # -- intake -------------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Queue `request` at the back of its priority class."""
        if not isinstance(request, EngineRequest):
            raise refusals.wrong_kind("request", "EngineRequest", request)
        if len(self.queue) >= self.config.max_queue:
            raise refusals.queue_full(request.request_id, len(self.queue))
        if request.request_id in self._cancelled:
            raise refusals.unreported_cancel(request.request_id)
        if request.request_id in self.queue or request.request_id in self.running.slots:
            raise refusals.duplicate_request(request.request_id)
        why = self.admission.never_fits(request)
        if why is not None:
            raise refusals.request_too_large(request.request_id, why)
        keys = self.keys.of_prompt(request) if self.config.prefix_caching else None  # hashed here, once
        self.queue.push(Queued(request), front=False, keys=keys)

    def cancel(self, request_id: int) -> None:
        """Stop a queued or running request now; the next step reports it as CANCELLED."""
        request_id = require_u64("request_id", request_id)
        slot = self.running.slots.get(request_id)
        if slot is not None:
            self.batch.release([slot])
        elif request_id in self.queue:
            self.queue.remove(request_id)
        else:
            raise refusals.unknown_request(request_id)
        self._cancelled.append(request_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        """Run a copy of a running request (the spec's `fork`)."""
        parent_id = require_u64("parent_id", parent_id)
        child_id = require_u64("child_id", child_id)
        parent = self.running.slots.get(parent_id)
        if parent is None:
            raise refusals.unknown_request(parent_id)
        if child_id in self._cancelled:
            raise refusals.unreported_cancel(child_id)
        if child_id in self.queue or child_id in self.running.slots:
            raise refusals.duplicate_request(child_id)
        if parent in self.running.waiting:
            raise refusals.copy_pending(parent_id, self.host_copies.promoted_page(parent))
        if len(self.running.slots) >= self.config.max_batch_size:
            raise refusals.batch_full(child_id, self.config.max_batch_size)
        if not self.running.state_slot_free():
            raise refusals.no_state_slot(child_id, len(self.running.state_owners))
        self.batch.fork(parent, child_id)

    def publish(self, request_id: int, tokens: int, identity: PrefixIdentity) -> None:
        """Publish a running request's KV for its first `tokens` tokens (the spec's `publish`)."""
        request_id = require_u64("request_id", request_id)
        slot = self.host_copies.readable(request_id)
        count = refusals.require_published_tokens(request_id, tokens, int(self.running.fields[slot, COMPUTED]))
        self.store.publish(PrefixPageSet(identity, self._pages_of(request_id, count), count), self.pool)

    def lease(self, request_id: int) -> int:
        """An asynchronous reader holds the running request's written pages (the spec's `lease`)."""
        request_id = require_u64("request_id", request_id)
        slot = self.host_copies.readable(request_id)
        return self.leases.take(self.pool, self._pages_of(request_id, int(self.running.fields[slot, COMPUTED])))

    def _pages_of(self, request_id: int, tokens: int) -> tuple[int, ...]:
        """The pages of a running request's first `tokens` tokens."""
        table = self.scheduler.page_table(request_id)[: pages_for(tokens, self.config.page_size)]
        return tuple(page for page in table if page is not None)

    def end_lease(self, lease_id: int) -> None:
        """The reader lets go (the spec's `end_lease`)."""
        self.leases.end(self.pool, lease_id)

    def has_work(self) -> bool:
        """Something is queued or running, a cancellation is not yet reported, or a copy between
        the tiers is in flight."""
        return bool(self.queue or self.running.slots or self._cancelled or self.host.copies)

    def reset_cache(self) -> None:
        """Drop every page of the automatic prefix cache and the host tier's cache; `CacheInUse`
        while any is held or a copy between the tiers is in flight."""
        if self.host.copies:
            raise refusals.cache_in_use(list(self.host.device_holds()))
        self.cache.reset(self.pool)
        self.host.reset()
        self.events.reset()

    def take_events(self) -> EventBatch | None:
        """The KV events since the last batch (the spec's `take_events`)."""
        return self.events.take_cached()

    def snapshot(self) -> Snapshot:
        """The cached set the batches so far published."""
        return self.events.snapshot()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One iteration, as the spec's `run_step`: the step planned, the model's calls, their
        answers committed, then the copies it started; an error before the commit leaves the
        engine exactly as before."""
        self.cache.settle()
        counters = self.cache.counters(), self.host.counters()
        issued = self.host.issued
        done = poll_copies(copier(self.model), list(self.host.copies.values())) if self.host.copies else {}
        admits = bool(self.queue) and len(self.running.slots) < self.config.max_batch_size
        mark = self.cache.mark()
        self.queue.mark()
        try:
            plan = self._plan(admits)
            sampled = self.batch.run_model(plan)
        except BaseException:
            self._undo_plan(mark)
            raise
        finally:
            self.queue.settle()
        self._commit(plan, sampled, done)
        if self.host.pages:
            self._start_copies([copy for tid, copy in self.host.copies.items() if tid >= issued], plan.record)
        self._cancelled = []  # reported by this step, which succeeded
        return self._output(plan.record, counters)

    def _plan(self, admits: bool) -> StepPlan:
        """The step decided before any model call (the spec's `plan_step`): room for the running
        requests (under pressure: relieve it, preempt, and plan nothing more), then the
        admissions (when the queue holds someone and a seat is free: `admits`). It only takes
        pages."""
        record = Record(finished=dict.fromkeys(self._cancelled, FinishReason.CANCELLED))
        room = self._make_room(record)
        if room is None:
            return StepPlan(record)
        round_plan, chunks = room
        count = self.batch.lower()  # the round as the room left it: no newcomer decodes this step
        copies, shortfall = self.batch.admit(count, chunks, newcomers=admits)
        return StepPlan(record, round_plan, count, chunks, copies, shortfall)

    def _commit(self, plan: StepPlan, sampled: list[int], done: dict[int, bool]) -> None:
        """The planned step's answers taken (the spec's `commit_step`): the newcomers'
        promotions issued, the copies `done` reports applied (a failed promotion preempts its
        request), the round's and the chunks' tokens (`sampled`), the pages they completed
        cached, the finished requests released, the relief the queue's front was short of, and
        the end-of-step eviction."""
        self.admission.promote()
        for slot in self.host_copies.complete(done):
            self.batch.preempt(slot, plan.record)
        if plan.round is not None:
            self.batch.commit(plan, sampled)
            self.cache_policy.publish_written(plan.record)
            if plan.record.finishing:
                self.batch.release(plan.record.finishing)
        if plan.shortfall is not None:
            self.cache_policy.relieve(plan.shortfall.pages, keep=plan.shortfall.keep)
        self.cache_policy.evict(self.config.prefill_reserve_pages - self.pool.free_count())

    def _undo_plan(self, mark: Mark) -> None:
        """A step failed before its commit: the engine as it was when it began. Its plan is the
        room and the admissions it took (`Batch.undo_room`), the cache's lookups (its journal,
        from `mark`) and the queue's pops."""
        self._undo_room()
        self.cache.undo(mark)
        self.queue.undo()

    def _undo_room(self) -> None:
        """The plan's room and admissions taken back (`Batch.undo_room`)."""
        self.batch.undo_room()

    def _start_copies(self, copies: list[Copy], record: Record) -> None:
        """Start the committed step's new copies between the tiers: one call, its last (all or
        none). When it raises, none started: each fails at once (the spec's `start_copies`)."""
        try:
            self._issue_copies(copies)
        except BackendFailed:
            for slot in self.host_copies.complete(dict.fromkeys((copy.transfer_id for copy in copies), False)):
                self.batch.preempt(slot, record)

    def _issue_copies(self, copies: list[Copy]) -> None:
        """The one call that starts `copies`: all or none."""
        issue_copies(copier(self.model), copies)

    def _output(self, record: Record, counters: tuple[tuple[int, ...], tuple[int, ...]]) -> StepOutput:
        return StepOutput(
            tokens=StepTokens(record.ids, record.tokens, record.prefilled),
            finished=record.finished,
            preempted=tuple(record.preempted),
            tokens_run=record.tokens_run,
            pages_in_use=self.config.pages - self.pool.free_count(),
            cache=self.cache.since(counters[0]),
            host=self.host.since(counters[1]),
        )

    def _make_room(self, record: Record) -> tuple[ArrayWritePlan, list[tuple[Chunk, int]]] | None:
        """The spec's `make_room`: room for the running requests, or relieve the pressure and do
        nothing more this step (None). A room that runs short takes nothing (`Batch.room`), and
        one found after relief is taken back: the step that freed pages writes none of them."""
        relieved = False
        while True:
            try:
                room = self.batch.room()
            except Exhausted as error:
                relieved_now = self.cache_policy.relieve(error.needed or 1)
                if relieved_now == 0 and self.host.copies:
                    return None  # copies in flight free or unpin pages when they complete: wait
                if relieved_now == 0 and not self.cache_policy.drop_for_the_last():
                    slot = self.batch.victim()
                    if slot is None:
                        raise
                    self.batch.preempt(slot, record)
                relieved = True
                continue
            if relieved:
                self.batch.undo_room()
                return None
            return room
