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

One step is a function on values, `run_step(state, config, model) -> (state, output)`
(`kvsched.spec.engine_step`, where the step is specified): `plan_step` decides everything the
step does before the model runs, `run_model` makes the calls that plan names, `commit_step`
applies their answers. The engine holds the state `run_step` returns, and only then.

Atomicity: `submit` and `cancel` change nothing on error; a model failure inside `step` (typed
`BackendFailed`, or the round's identity errors) leaves the engine exactly as before the step,
so it can be retried: the plan and the commit are values and the engine never held them. With a
host tier, a step's new copies are started by its last call, after the commit, one
`start_copies` that starts all or none (`kvsched.spec.model.CopyBackend`): once it returns they
are the engine's state; when it raises none runs and each fails at once (a failed promotion
preempts its request), while the step stands. So no copy the backend runs is one the engine
forgot, and no step is undone after its commit. A failing tier
degrades and never stalls: a page whose demotion failed is evicted, not demoted again, and a
failed host page is handed out last (`kvsched.spec.host_tier`).
Determinism: a request's tokens depend only on its own tokens (greedy), whether it ran alone,
batched, chunked, or was preempted and recomputed.
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.spec import host_tier, refusals
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_calls import copier
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput, fits, pages_for
from kvsched.spec.engine_events import Publisher, cached_entries
from kvsched.spec.engine_host import promoted_page, readable
from kvsched.spec.engine_leases import end, take
from kvsched.spec.engine_running import release
from kvsched.spec.engine_state import EngineState, Queued, enqueue, live_ids
from kvsched.spec.engine_step import run_step
from kvsched.spec.engine_work import Work
from kvsched.spec.errors import KvschedError
from kvsched.spec.host_tier import HostState
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.kv_events import EventBatch, Snapshot
from kvsched.spec.model import EngineModel
from kvsched.spec.pool import BlockPool
from kvsched.spec.prefix import PrefixPageSet
from kvsched.spec.prefix_cache import CacheState


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
        """One iteration (`kvsched.spec.engine_step`): `run_step` on the engine's state, which
        the engine then holds. On any error the engine is as before: it has not been touched."""
        self._state, output = run_step(self._state, self.config, self.model)
        return output


__all__ = ["Engine", "EngineConfig", "EngineRequest", "KvschedError", "StepOutput"]
