"""The continuous-batching engine over impl's certified parts: the spec's `Engine`, built for speed.

Same operations, outputs, errors and order as `kvsched.spec.engine` (read it for the step), over
`kvsched.impl`'s pool, store and scheduler. What differs is storage. Each running request lives
in its scheduler slot's row of fixed arrays allocated at construction (`kvsched.impl.engine_rows`:
its tokens and its fields), so a decode step appends every token and finds every finished
request in one kernel call, and its `StepOutput.tokens` is a lazy mapping over the round's output
arrays. The engine is wiring and the step over parts, the spec's in impl's storage: the running
requests, the queue, the page keys and the leases each hold their own state and `to_spec`
(`kvsched.impl.engine_running`, `engine_queue`, `engine_keys`, `engine_leases`); the admission
policy (`engine_admission`), the cache's policy and the relief of pressure (`engine_cache`) and
the copies between the tiers (`engine_host`) change the engine's parts.

Atomicity, two ways:
- A step that only decodes (nothing to cancel, prefill or admit) plans, runs the model, then
  commits: its only change before the model calls is the decode round's write plan, which
  `undo_decode_round` takes back exactly if a call fails. Every later change follows the last
  model call. It copies nothing, so its cost does not grow with the pool.
- Any other step starts from a checkpoint (`kvsched.impl.checkpoint` for the certified parts,
  the running set's `save`, the cache's journal mark, the host tier's snapshot; the queue marks
  itself) and restores it on any error.
`to_spec()` is the abstraction function to the spec's `EngineState`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from kvsched.impl import checkpoint
from kvsched.impl.engine_admission import Admission, copy_pairs
from kvsched.impl.engine_cache import CachePolicy
from kvsched.impl.engine_host import HostCopies
from kvsched.impl.engine_keys import PageKeys
from kvsched.impl.engine_leases import Leases
from kvsched.impl.engine_queue import WaitingQueue
from kvsched.impl.engine_rows import (
    ADMITTED,
    COMPUTED,
    DECODING,
    EOS,
    FILLED,
    LENGTH,
    LIMIT,
    STATE_SLOT,
    commit_round,
)
from kvsched.impl.engine_running import Record, RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import Mark, PrefixCache
from kvsched.impl.scheduler import (
    RequestScheduler,
    finish_slots,
    get_indexes,
    get_slots,
    round_outputs,
    undo_decode_round,
)
from kvsched.impl.slots import PREFILL
from kvsched.impl.writes import ArrayWritePlan
from kvsched.spec import refusals
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_calls import (
    Chunk,
    call_model,
    copier,
    issue_copies,
    poll_copies,
    require_prefill_tokens,
)
from kvsched.spec.engine_config import (
    EngineConfig,
    EngineRequest,
    StepOutput,
    pages_for,
)
from kvsched.spec.engine_state import EngineState, Queued, external_holds
from kvsched.spec.errors import Exhausted
from kvsched.spec.host_tier import Copy
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.model import EngineModel, PrefillItem
from kvsched.spec.prefix import MAX_SET_PAGES, PrefixPageSet
from kvsched.spec.sequence import FinishReason
from kvsched.spec.system import SystemState


class StepTokens(Mapping[int, tuple[int, ...]]):
    """Each request's new tokens this step (at most one each): the decode round's outputs, kept
    as arrays until read, and the prefill's."""

    __slots__ = ("_ids", "_items", "_prefill", "_tokens")

    def __init__(self, ids: npt.NDArray[Any], tokens: npt.NDArray[Any], prefill: dict[int, tuple[int, ...]]) -> None:
        self._ids, self._tokens, self._prefill = ids, tokens, prefill
        self._items: dict[int, tuple[int, ...]] | None = None

    def _dict(self) -> dict[int, tuple[int, ...]]:
        items = self._items
        if items is None:
            items = {rid: (token,) for rid, token in zip(self._ids.tolist(), self._tokens.tolist(), strict=True)}
            items.update(self._prefill)
            self._items = items
        return items

    def __getitem__(self, request_id: int) -> tuple[int, ...]:
        return self._dict()[request_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return repr(self._dict())


@dataclass(slots=True)
class Saved:
    """The engine at the start of a step: the certified parts (`parts`), the cache's journal mark,
    copies of `Engine.STEP_STATE`, the running set's save and the host tier's snapshot (the queue
    keeps its own: `WaitingQueue.mark`)."""

    parts: checkpoint.Checkpoint
    cache: Mark
    state: dict[str, Any]
    running: dict[str, Any]  # the running set's save (`RunningSet.save`)
    host: tuple[Any, ...] | None = None  # the host tier's snapshot (None: the engine has none)


def _copy(value: Any) -> Any:
    """A copy deep enough that changing the engine's value leaves it as it is: lists, sets and
    dicts are copied (their items are ints, never changed in place); ints and None are kept."""
    if isinstance(value, list | set | dict):
        return type(value)(value)
    return value


class Engine:
    """The continuous-batching engine over impl's parts; see `kvsched.spec.engine`."""

    # What a failed step puts back, beside the certified parts (`kvsched.impl.checkpoint`) and
    # the cache (its journal): saved at the start of every step that is not decode-only ...
    STEP_STATE: ClassVar[tuple[str, ...]] = ("_cancelled",)
    # Everything else the engine holds, and why a failed step needs none of it back (a test
    # requires every attribute to be in one of the three).
    NOT_RESTORED: ClassVar[Mapping[str, str]] = {
        "config": "never changes",
        "model": "never changes",
        "pool": "a certified part: the checkpoint",
        "store": "a certified part: the checkpoint",
        "scheduler": "a certified part: the checkpoint",
        "cache": "its journal: mark and undo",
        "host": "its snapshot, saved with the checkpoint",
        "running": "a part: saved with the checkpoint (`RunningSet.save`)",
        "keys": "a part: a slot's keys name its tokens; a failed admission's are replaced by the slot's next",
        "_filled": "one round's output buffer",
        "_done": "one round's output buffer",
        "_step_state": "the last checkpoint, whose buffers the next reuses",
        "queue": "a part: marked when a step begins, it copies itself when the step first changes it",
        "leases": "a part changed by lease and end_lease only, never by a step",
        "cache_policy": "a part with no state of its own",
        "host_copies": "a part with no state of its own",
        "admission": "a part whose state is one step's, set before it is read",
    }

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
        self.running = RunningSet(config)
        self.queue = WaitingQueue()
        self._cancelled: list[int] = []
        self.cache = PrefixCache(config.pages)
        self.keys = PageKeys(config, self.running.tokens)
        self._filled = np.zeros((config.requests, FILLED), dtype=np.int64)  # a round's filled pages
        self._done = np.zeros(config.requests, dtype=np.intp)  # a round's outputs that finished
        self._step_state: Saved | None = None  # the last step's checkpoint, whose buffers the next reuses
        self.host = HostTier(config.host_pages)
        self.leases = Leases()
        self.cache_policy = CachePolicy(
            config, self.pool, self.store, self.scheduler, self.cache, self.host, self.keys, self.running
        )
        self.host_copies = HostCopies(config.page_size, self.pool, self.cache, self.host, self.running)
        self.admission = Admission(
            config, self.scheduler, self.store, self.queue, self.running, self.keys, self.cache_policy, self.host_copies
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
            self._release([slot])
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
        slot = self.scheduler.fork(parent_id, child_id, self.pool)
        request = self.running.requests[parent]
        assert request is not None
        self.running.tokens[slot] = self.running.tokens[parent]
        self.running.fields[slot] = self.running.fields[parent]
        self.running.fields[slot, ADMITTED] = self.running.admissions
        self.running.fields[slot, STATE_SLOT] = self.running.take_state_slot(child_id)
        self.running.admissions += 1
        self.running.requests[slot] = replace(request, request_id=child_id)
        self.keys.slots[slot] = list(self.keys.slots[parent])
        self.running.slots[child_id] = slot
        if parent in self.running.prefilling:
            self.running.prefilling.add(slot)

    def publish(self, request_id: int, tokens: int, identity: PrefixIdentity) -> None:
        """Publish a running request's KV for its first `tokens` tokens (the spec's `publish`)."""
        request_id = require_u64("request_id", request_id)
        slot = self.host_copies.readable(request_id)
        count = refusals.require_published_tokens(request_id, tokens, int(self.running.fields[slot, COMPUTED]))
        pages = self.scheduler.page_table(request_id)[: pages_for(count, self.config.page_size)]
        self.store.publish(PrefixPageSet(identity, tuple(page for page in pages if page is not None), count), self.pool)

    def lease(self, request_id: int) -> int:
        """An asynchronous reader holds the running request's written pages (the spec's `lease`)."""
        request_id = require_u64("request_id", request_id)
        slot = self.host_copies.readable(request_id)
        table = self.scheduler.page_table(request_id)[
            : pages_for(int(self.running.fields[slot, COMPUTED]), self.config.page_size)
        ]
        return self.leases.take(self.pool, tuple(page for page in table if page is not None))

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

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> StepOutput:
        """One iteration, as the spec's; on any error the engine is exactly as before."""
        self.cache.settle()
        counters = self.cache.counters(), self.host.counters()
        if self._decodes_only():
            record = self._decode_step()
            if record is not None:
                return self._output(record, counters)
        issued = self.host.issued
        done = poll_copies(copier(self.model), list(self.host.copies.values()))
        saved = self._step_state = self._save(self._step_state)
        self.queue.mark()
        try:
            record = Record(finished=dict.fromkeys(self._cancelled, FinishReason.CANCELLED))
            self._cancelled = []
            room = None
            failed = self.host_copies.complete(done)
            for slot in failed:  # a promotion failed: its request is preempted
                self._preempt(slot, record)
            if not failed:
                room = self._make_room(record, self._save() if done else saved)
            if room is not None:
                plan, chunks = room
                self._commit_round(self._run_round(plan), record)
                self._prefill(chunks, record)
                self._finish_step(record)
            self.cache_policy.evict(self.config.prefill_reserve_pages - self.pool.free_count())
            self._issue_copies([copy for tid, copy in self.host.copies.items() if tid >= issued])
        except BaseException:
            self._undo_step(saved)
            raise
        finally:
            self.queue.settle()
        return self._output(record, counters)

    def _undo_step(self, saved: Saved) -> None:
        """A step failed: the engine as it was when it began."""
        self._rollback(saved)
        self.queue.undo()

    def _issue_copies(self, copies: list[Copy]) -> None:
        """Start the step's new copies between the tiers: one call, its last (all or none)."""
        issue_copies(copier(self.model), copies)

    def _decodes_only(self) -> bool:
        """This step can only decode: nothing to cancel or prefill, and nobody it could admit
        (the queue is empty or the batch full)."""
        if self._cancelled or self.running.prefilling or self.host.pages:
            return False  # (a host tier's steps poll and issue copies: the general step)
        return not self.queue or len(self.running.slots) >= self.config.max_batch_size

    def _decode_step(self) -> Record | None:
        """A step that only decodes: plan the round, run it, commit. None, with nothing changed,
        when the round does not fit (the general step makes room)."""
        try:
            plan = self.scheduler.prepare_decode_round(self.pool, self.config.page_size)
        except Exhausted:
            return None  # all or nothing: the plan took no page
        record = Record()
        try:
            count = self._run_round(plan)
        except BaseException:
            self._undo_round(plan)
            raise
        self._commit_round(count, record)
        self._finish_step(record)
        self.cache_policy.evict(self.config.prefill_reserve_pages - self.pool.free_count())
        return record

    def _undo_round(self, plan: ArrayWritePlan) -> None:
        """A decode-only step's round failed: take back its write plan."""
        undo_decode_round(self.scheduler, plan, self.pool)

    def _finish_step(self, record: Record) -> None:
        """After the step's model calls: cache the pages it completed, release what finished."""
        self.cache_policy.publish_written(record)
        if record.finishing:
            self._release(record.finishing)

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

    def _save(self, reuse: Saved | None = None) -> Saved:
        """The engine's state; `reuse`, an earlier one, lends its buffers (its arrays)."""
        parts = checkpoint.save(self.pool, self.store, self.scheduler, None if reuse is None else reuse.parts)
        state: dict[str, Any] = {}
        for name in self.STEP_STATE:
            state[name] = _copy(getattr(self, name))
        running = self.running.save(None if reuse is None else reuse.running)
        return Saved(parts, self.cache.mark(), state, running, host=self.host.snapshot() if self.host.pages else None)

    def _rollback(self, saved: Saved) -> None:
        """Restore `saved` (which stays intact: it may be restored again)."""
        checkpoint.restore(saved.parts, self.pool, self.store, self.scheduler)
        self.cache.undo(saved.cache)
        if saved.host is not None:
            self.host.restore(saved.host)
        self.running.restore(saved.running)
        for name, value in saved.state.items():
            setattr(self, name, _copy(value))

    def _make_room(self, record: Record, inner: Saved) -> tuple[ArrayWritePlan, list[tuple[Chunk, int]]] | None:
        """The spec's `_make_room` from checkpoint `inner`: room for the running requests, or
        relieve the pressure and do nothing more this step (None)."""
        relieved = False
        while True:
            try:
                room = self._room_for_running()
            except Exhausted as error:
                self._rollback(inner)
                self._cancelled = []
                relieved_now = self.cache_policy.relieve(error.needed or 1)
                if relieved_now == 0 and self.host.copies:
                    return None  # copies in flight free or unpin pages when they complete: wait
                if relieved_now == 0 and not self.cache_policy.drop_for_the_last():
                    slot = self._victim()
                    if slot is None:
                        raise
                    self._preempt(slot, record)
                relieved = True
                inner = self._save()
                continue
            if relieved:
                self._rollback(inner)
                return None
            return room

    def _room_for_running(self) -> tuple[ArrayWritePlan, list[tuple[Chunk, int]]]:
        plan = self.scheduler.prepare_decode_round(self.pool, self.config.page_size)
        budget = self.admission.token_budget(get_indexes(self.scheduler)[2])
        chunks = []
        for slot in sorted(self.running.prefilling, key=self.running.prefill_order):
            if self.host_copies.waits(slot):
                continue  # it computes nothing until its promotions complete
            if budget == 0:
                break
            request = self.running.requests[slot]
            assert request is not None
            computed = int(self.running.fields[slot, COMPUTED])
            length = min(self.config.chunk_size, int(self.running.fields[slot, LENGTH]) - computed, budget)
            room = self.scheduler.record_chunk(request.request_id, length, self.pool)
            chunks.append((Chunk(request.request_id, computed, length, copy_pairs(room)), slot))
            budget -= length
        return plan, chunks

    def _run_round(self, plan: ArrayWritePlan) -> int:
        """The decode round's model calls (its copies, then the round): how many requests it ran.
        A call that fails leaves the slots as the plan left them."""
        count = get_indexes(self.scheduler)[2]
        if count == 0:
            return 0
        if plan.copy_sources.shape[0]:
            self._copy_round_pages(copy_pairs(plan))
        self.scheduler.execute_decode_round(self.model)
        return count

    def _copy_round_pages(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """The decode round's copy-on-write copies, before the round."""
        call_model(lambda: self.model.copy_pages(pairs))

    def _commit_round(self, count: int, record: Record) -> None:
        """Append the round's `count` sampled tokens to their rows and record them; note the
        pages the round filled and the requests it finished."""
        if count == 0:
            return
        outputs = round_outputs(self.scheduler, count)
        slots, sampled = outputs["slot"], outputs["next_token_id"]
        filled, done = self._filled[:count], self._done[:count]
        tables = get_slots(self.scheduler).tables
        at, filled_count, done_count = commit_round(
            slots, sampled, self.running.fields, self.running.tokens, tables, self.config.page_size, filled, done
        )
        assert at < 0, "the round's outputs name their slots, ascending, each with room for a token"
        record.ids, record.tokens = outputs["request_id"].copy(), sampled.copy()
        record.tokens_run += count
        if self.config.prefix_caching:
            record.filled = filled[:filled_count].tolist()
        fields = self.running.fields
        for index in done[:done_count].tolist():
            slot, token = int(slots[index]), int(sampled[index])
            reason = FinishReason.EOS if token == fields[slot, EOS] else FinishReason.MAX_LENGTH
            self._finishing(slot, reason, record)

    def _finishing(self, slot: int, reason: FinishReason, record: Record) -> None:
        """`slot`'s request finished: reported now, released at the end of the step."""
        request = self.running.requests[slot]
        assert request is not None
        record.finished[request.request_id] = reason
        record.finishing.append(slot)

    def _prefill(self, chunks: list[tuple[Chunk, int]], record: Record) -> None:
        """Run the running requests' chunks and admit newcomers into the budget left (their
        pages attached and allocated in one call once all are chosen: `Admission.admit`)."""
        budget = self.admission.token_budget(record.tokens_run) - sum(chunk.length for chunk, _ in chunks)
        copies = tuple(pair for chunk, _ in chunks for pair in chunk.copies)
        copies += self.admission.admit(budget, chunks)
        if chunks:
            self._run_chunks(chunks, copies, record)

    def _run_chunks(self, chunks: list[tuple[Chunk, int]], copies: tuple[tuple[int, int], ...], record: Record) -> None:
        if copies:
            call_model(lambda: self.model.copy_pages(copies))
        items = [
            PrefillItem(
                chunk.request_id,
                slot,
                tuple(self.running.tokens[slot, chunk.start : chunk.start + chunk.length].tolist()),
                chunk.start,
                self.scheduler.page_table(chunk.request_id),
            )
            for chunk, slot in chunks
        ]
        answer = call_model(lambda: self.model.execute_prefill(items))
        sampled = require_prefill_tokens(answer, len(items))
        for (chunk, slot), token in zip(chunks, sampled, strict=True):
            computed = chunk.start + chunk.length
            record.chunks.append((slot, chunk.start, computed))
            record.tokens_run += chunk.length
            self.running.fields[slot, COMPUTED] = computed
            if computed == self.running.fields[slot, LENGTH]:
                self._complete(slot, chunk.request_id, token, record)

    def _complete(self, slot: int, request_id: int, token: int, record: Record) -> None:
        """The prefill of `slot` is complete and sampled `token`: append it; finish, or decode."""
        fields = self.running.fields
        length = int(fields[slot, LENGTH])
        self.running.tokens[slot, length] = token
        fields[slot, LENGTH] = length + 1
        record.prefilled[request_id] = (token,)
        if token == fields[slot, EOS] or length + 1 >= fields[slot, LIMIT]:
            self._finishing(slot, FinishReason.EOS if token == fields[slot, EOS] else FinishReason.MAX_LENGTH, record)
            return
        if get_slots(self.scheduler).states[slot] == PREFILL:
            self.scheduler.mark_prefill_complete(request_id)
        self.scheduler.seed_decode_token(request_id, token)
        fields[slot, DECODING] = 1
        fields[slot, COMPUTED] = length
        self.running.prefilling.discard(slot)

    # -- releasing and preempting -------------------------------------------------------------

    def _release(self, slots: list[int]) -> None:
        """Finish the requests in `slots`, in order (pages released), and free their state slots."""
        if self.config.prefix_caching:
            self.cache.stamp(get_slots(self.scheduler).tables[slots])
        finish_slots(self.scheduler, slots, self.pool)
        for slot in slots:
            self.running.leave(slot)

    def _victim(self) -> int | None:
        return min(self.running.slots.values(), key=self.running.victim_order, default=None)

    def _preempt(self, slot: int, record: Record) -> None:
        request, generated = self.running.request(slot), self.running.generated(slot)
        self._release([slot])
        # its keys name the same tokens when it is admitted again
        keys = self.keys.slots[slot] if self.config.prefix_caching else None
        self.queue.push(Queued(request, generated), front=True, keys=keys)
        record.preempted.append(request.request_id)
