"""The continuous-batching engine over impl's certified parts: the spec's `Engine`, built for speed.

Same operations, outputs, errors and order as `kvsched.spec.engine` (read it for the step), over
`kvsched.impl`'s pool, store and scheduler. What differs is storage. Each running request lives
in its scheduler slot's row of fixed arrays allocated at construction (`kvsched.impl.engine_rows`:
its tokens and its fields), so a decode step appends every token and finds every finished
request in one kernel call, and its `StepOutput.tokens` is a lazy mapping over the round's output
arrays. The running requests, the queue, the page keys and the leases are parts, each with its
own state and `to_spec` (`kvsched.impl.engine_running`, `engine_queue`, `engine_keys`,
`engine_leases`).

Atomicity, two ways:
- A step that only decodes (nothing to cancel, prefill or admit) plans, runs the model, then
  commits: its only change before the model calls is the decode round's write plan, which
  `undo_decode_round` takes back exactly if a call fails. Every later change follows the last
  model call. It copies nothing, so its cost does not grow with the pool.
- Any other step starts from a checkpoint (`kvsched.impl.checkpoint` for the certified parts,
  the running set's `save`, the cache's journal mark, the queue's and host tier's snapshots) and
  restores it on any error.
`to_spec()` is the abstraction function to the spec's `EngineState`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from kvsched.impl import checkpoint
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
    NO_TOKEN,
    STATE_SLOT,
    commit_round,
)
from kvsched.impl.engine_running import RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import Mark, PrefixCache
from kvsched.impl.scheduler import (
    Newcomer,
    RequestScheduler,
    claim_slot,
    finish_slots,
    get_indexes,
    get_slots,
    round_outputs,
    seat_newcomers,
    undo_decode_round,
)
from kvsched.impl.slots import PREFILL
from kvsched.impl.writes import ArrayWritePlan
from kvsched.spec import refusals
from kvsched.spec.domain import require_u64
from kvsched.spec.engine_calls import (
    Chunk,
    call_model,
    chunk_pages,
    copier,
    issue_copies,
    poll_copies,
    require_prefill_tokens,
)
from kvsched.spec.engine_config import (
    EngineConfig,
    EngineRequest,
    StepOutput,
    admission_pages,
    fits,
    pages_for,
)
from kvsched.spec.engine_state import EngineState, Queued, external_holds
from kvsched.spec.errors import Exhausted
from kvsched.spec.host_tier import PROMOTE, Copy
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.model import EngineModel, PrefillItem
from kvsched.spec.page_keys import Key
from kvsched.spec.prefix import MAX_SET_PAGES, PrefixPageSet, droppable
from kvsched.spec.prefix_cache import get_cache_references
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


NOTHING = np.zeros(0, dtype=np.uint64)  # no round ran: no ids, no tokens
NOTHING.flags.writeable = False


@dataclass(slots=True)
class Record:
    """What a step has done so far."""

    ids: npt.NDArray[Any] = field(default_factory=lambda: NOTHING)  # the round's request ids (an array it owns)
    tokens: npt.NDArray[Any] = field(default_factory=lambda: NOTHING)  # and sampled tokens
    prefilled: dict[int, tuple[int, ...]] = field(default_factory=dict)
    finished: dict[int, FinishReason] = field(default_factory=dict)
    preempted: list[int] = field(default_factory=list)
    finishing: list[int] = field(default_factory=list)  # slots finished this step: released at its end
    tokens_run: int = 0
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, start, stop) each chunk wrote
    filled: list[list[int]] = field(default_factory=list)  # the round's filled pages: (admitted, slot, depth, page)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """An admission short of free pages: how many it needs, and the cached pages it would hit
    (which relief must not evict)."""

    pages: int
    keep: list[int]


@dataclass(slots=True)
class Saved:
    """The engine at the start of a step: the certified parts (`parts`), the cache's journal mark,
    copies of `Engine.STEP_STATE`, the running set's save and, once the step first changes the
    queue, the queue's snapshot."""

    parts: checkpoint.Checkpoint
    cache: Mark
    state: dict[str, Any]
    running: dict[str, Any]  # the running set's save (`RunningSet.save`)
    queue: tuple[Any, ...] | None = None  # the queue's snapshot, once the step changes it
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
        "_committed": "one step's running sum, set before it is read",
        "_filled": "one round's output buffer",
        "_done": "one round's output buffer",
        "_saved": "the running step's checkpoint",
        "_step_state": "the last checkpoint, whose buffers the next reuses",
        "_fetching": "one step's newcomers' host runs, emptied when they are seated",
        "queue": "a part: its snapshot, taken when a step first changes it",
        "leases": "a part changed by lease and end_lease only, never by a step",
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
        self._committed: int | None = None  # this step's running prefills' pages past their chunks
        self._filled = np.zeros((config.requests, FILLED), dtype=np.int64)  # a round's filled pages
        self._done = np.zeros(config.requests, dtype=np.intp)  # a round's outputs that finished
        self._saved: Saved | None = None  # the running step's checkpoint
        self._step_state: Saved | None = None  # the last step's checkpoint, whose buffers the next reuses
        self.host = HostTier(config.host_pages)
        self._fetching: dict[int, list[tuple[Key, int, int]]] = {}  # newcomer slot -> its host run, until seated
        self.leases = Leases()
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
        why = self._never_fits(request)
        if why is not None:
            raise refusals.request_too_large(request.request_id, why)
        keys = self.keys.of_prompt(request) if self.config.prefix_caching else None  # hashed here, once
        self._enqueue(Queued(request), front=False, keys=keys)

    def _never_fits(self, request: EngineRequest) -> str | None:
        """Why `request` can never run on this engine (`fits`), or None."""
        return fits(self.config, request)

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
            raise refusals.copy_pending(parent_id, self._promoted_page(parent))
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
        slot = self._readable(request_id)
        count = refusals.require_published_tokens(request_id, tokens, int(self.running.fields[slot, COMPUTED]))
        pages = self.scheduler.page_table(request_id)[: pages_for(count, self.config.page_size)]
        self.store.publish(PrefixPageSet(identity, tuple(page for page in pages if page is not None), count), self.pool)

    def lease(self, request_id: int) -> int:
        """An asynchronous reader holds the running request's written pages (the spec's `lease`)."""
        request_id = require_u64("request_id", request_id)
        slot = self._readable(request_id)
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

    # -- the queue ----------------------------------------------------------------------------

    def _enqueue(self, entry: Queued, *, front: bool, keys: list[Key] | None = None) -> None:
        """Queue `entry` (a submission at the back of its class; a preempted request at the front)."""
        self._touch_queue()
        self.queue.push(entry, front=front, keys=keys)

    def _touch_queue(self) -> None:
        """Save the queue (once per step) before the step changes it."""
        saved = self._saved
        if saved is not None and saved.queue is None:
            saved.queue = self.queue.snapshot()

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
        saved = self._saved = self._step_state = self._save(self._step_state)
        try:
            record = Record(finished=dict.fromkeys(self._cancelled, FinishReason.CANCELLED))
            self._cancelled = []
            room = None
            if not self._complete_copies(done, record):
                room = self._make_room(record, self._save() if done else saved)
            if room is not None:
                plan, chunks = room
                self._commit_round(self._run_round(plan), record)
                self._prefill(chunks, record)
                self._finish_step(record)
            self._evict(self.config.prefill_reserve_pages - self.pool.free_count())
            self._issue_copies([copy for tid, copy in self.host.copies.items() if tid >= issued])
        except BaseException:
            self._undo_step(saved)
            raise
        finally:
            self._saved = None
        return self._output(record, counters)

    def _undo_step(self, saved: Saved) -> None:
        """A step failed: the engine as it was when it began."""
        self._rollback(saved)

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
        self._evict(self.config.prefill_reserve_pages - self.pool.free_count())
        return record

    def _undo_round(self, plan: ArrayWritePlan) -> None:
        """A decode-only step's round failed: take back its write plan."""
        undo_decode_round(self.scheduler, plan, self.pool)

    def _finish_step(self, record: Record) -> None:
        """After the step's model calls: cache the pages it completed, release what finished."""
        self._publish_written(record)
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
        if saved.queue is not None:
            self.queue.restore(saved.queue)
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
                relieved_now = self._relieve(error.needed or 1)
                if relieved_now == 0 and self.host.copies:
                    return None  # copies in flight free or unpin pages when they complete: wait
                if relieved_now == 0 and not self._drop_for_the_last():
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
        budget = self._token_budget(get_indexes(self.scheduler)[2])
        chunks = []
        for slot in sorted(self.running.prefilling, key=self.running.prefill_order):
            if self._waits(slot):
                continue  # it computes nothing until its promotions complete
            if budget == 0:
                break
            request = self.running.requests[slot]
            assert request is not None
            computed = int(self.running.fields[slot, COMPUTED])
            length = min(self.config.chunk_size, int(self.running.fields[slot, LENGTH]) - computed, budget)
            room = self.scheduler.record_chunk(request.request_id, length, self.pool)
            chunks.append((Chunk(request.request_id, computed, length, _pairs(room)), slot))
            budget -= length
        return plan, chunks

    def _token_budget(self, decoding: int) -> int:
        """The tokens the step's prefill chunks may take, `decoding` requests decoding."""
        return self.config.max_batched_tokens - decoding

    def _run_round(self, plan: ArrayWritePlan) -> int:
        """The decode round's model calls (its copies, then the round): how many requests it ran.
        A call that fails leaves the slots as the plan left them."""
        count = get_indexes(self.scheduler)[2]
        if count == 0:
            return 0
        if plan.copy_sources.shape[0]:
            self._copy_round_pages(_pairs(plan))
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
        pages attached and allocated in one call once all are chosen: `seat_newcomers`)."""
        budget = self._token_budget(record.tokens_run) - sum(chunk.length for chunk, _ in chunks)
        copies = [pair for chunk, _ in chunks for pair in chunk.copies]
        self._committed = None
        self._fetching.clear()
        newcomers: list[Newcomer] = []
        claimed = 0  # the free pages the newcomers' chunks take
        while budget:
            admitted = self._admit(budget, self.pool.free_count() - claimed, newcomers, chunks)
            if admitted is None:
                break
            if isinstance(admitted, Shortfall):  # relieve the pressure for a later step, after seating
                copies += self._seat(newcomers)
                newcomers = []
                self._relieve(admitted.pages, keep=admitted.keep)
                break
            if admitted[1] not in self._fetching:  # else it waits for its promotions
                chunks.append(admitted)
            budget -= admitted[0].length
            claimed += len(newcomers[-1].pages)
        copies += self._seat(newcomers)
        if chunks:
            self._run_chunks(chunks, tuple(copies), record)

    def _seat(self, newcomers: list[Newcomer]) -> tuple[tuple[int, int], ...]:
        """Attach and allocate the newcomers' pages, and promote into those of the ones that
        found pages in the host tier; the copies their chunks need."""
        if not newcomers:
            return ()
        copies = _pairs(seat_newcomers(self.scheduler, newcomers, self.store, self.pool))
        tables = get_slots(self.scheduler).tables
        for newcomer in newcomers:
            fetch = self._fetching.pop(newcomer.slot, None)
            if fetch is None:
                continue
            request = self.running.request(newcomer.slot)
            waiting = []
            for depth, (key, _, _) in zip(newcomer.pages, fetch, strict=True):
                page = int(tables[newcomer.slot, depth])
                self.pool.retain(page)  # the copy's hold
                waiting.append(self.host.promote(key, page, request.request_id))
            self.host.count_hit(len(fetch) * self.config.page_size)
            self.running.waiting[newcomer.slot] = tuple(waiting)
        return copies

    def _guarded(self, free: int) -> bool:
        """The memory guard stops admissions: fewer than `prefill_reserve_pages` are `free` while
        requests run (an empty batch is never starved)."""
        return free < self.config.prefill_reserve_pages and bool(self.running.slots)

    def _reused(self, tokens: int, length: int) -> int:
        """Of a named prefix's `tokens`, those a sequence of `length` reuses: all but its last
        token at most (recomputed, so the request samples from its own logits)."""
        return min(tokens, length - 1)

    def _admit(
        self, budget: int, free: int, newcomers: list[Newcomer], chunks: list[tuple[Chunk, int]]
    ) -> tuple[Chunk, int] | Shortfall | None:
        """Admit the front of the queue into `newcomers` (its pages not yet seated), with `free`
        pages left: its chunk and slot; a `Shortfall` when its pages are not free; else None."""
        front = self.queue.front()
        if front is None or len(self.running.slots) >= self.config.max_batch_size:
            return None
        if self._guarded(free):
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
            return Shortfall(needed, hit)  # relieved for a later step: this one writes no freed page
        request_id = request.request_id
        slot = claim_slot(self.scheduler, request_id)
        if fetch:  # fresh pages for the host run, counted; it waits for their promotions (`_seat`)
            pages, counted, length = range(cached // page_size, cached // page_size + len(fetch)), fetched, 0
            self._fetching[slot] = fetch
        else:
            counted = length if named + len(hit) * page_size == cached else 0  # a full hit's prefix counts it
        newcomers.append(Newcomer(slot, identity, hit, pages, counted))
        if self.config.prefix_caching:
            self.cache.count_query(length_of, len(hit) * page_size)
            self.keys.slots[slot] = keys
        self._touch_queue()
        self.queue.pop_front()
        self.running.tokens[slot, : len(request.prompt)] = np.frombuffer(request.prompt_bytes, dtype="<u4")
        if front.generated:
            self.running.tokens[slot, len(request.prompt) : length_of] = front.generated
        state_slot = self.running.take_state_slot(request_id)
        eos = NO_TOKEN if request.eos_token_id is None else request.eos_token_id
        limit = len(request.prompt) + request.max_new_tokens
        cached += fetched
        self.running.fields[slot] = (length_of, limit, eos, cached, 0, self.running.admissions, state_slot)
        if self._committed is not None:  # the pages its prefill takes after this step's chunk
            self._committed += pages_for(length_of, page_size) - pages_for(cached + length, page_size)
        self.running.admissions += 1
        self.running.requests[slot] = request
        self.running.slots[request_id] = slot
        self.running.prefilling.add(slot)
        return Chunk(request_id, cached, length, ()), slot

    def _keys_of(self, entry: Queued, pages: int) -> list[Key]:
        """The keys of the queued `entry`'s first `pages` full pages (`PageKeys.of_queued`)."""
        return self.keys.of_queued(entry, pages, self.queue.kept_keys(entry))

    def _admission_pages(self, length: int, cached: int, free: int, chunks: list[tuple[Chunk, int]]) -> int:
        """The spec's `_admission_pages`, the running prefills' rests from their fields; 0 when
        even the most they could need leaves `free` enough (the same admission, sooner known)."""
        if not self.running.slots:
            return 0
        most = admission_pages(self.config, length, cached, len(self.running.prefilling) * self.config.logical_pages)
        if most <= free:
            return 0
        committed = self._committed
        if committed is None:  # summed once a step, then kept up to date by each admission
            page_size, fields = self.config.page_size, self.running.fields
            recorded = {slot: chunk.start + chunk.length for chunk, slot in chunks}
            committed = 0
            for slot in self.running.prefilling:  # a few slots: a loop costs less than numpy's calls here
                computed = recorded.get(slot)
                if computed is None:
                    computed = fields[slot, COMPUTED].item()
                committed += pages_for(fields[slot, LENGTH].item(), page_size) - pages_for(computed, page_size)
            self._committed = committed
        return admission_pages(self.config, length, cached, committed)

    def _usable_prefix(
        self, identity: PrefixIdentity | None, length: int, budget: int
    ) -> tuple[PrefixIdentity | None, int, int]:
        """The named prefix a request of `length` tokens can attach: its identity, its tokens and
        the tokens it leaves uncomputed (all but the last token at most); else (None, 0, 0)."""
        page_set = None if identity is None else self.store.get(identity)
        if page_set is None or page_set.token_count > length:
            return None, 0, 0
        cached = self._reused(page_set.token_count, length)
        if length - cached > min(self.config.chunk_size, budget):
            return None, 0, 0
        return identity, page_set.token_count, cached

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
        self._enqueue(Queued(request, generated), front=True, keys=keys)
        record.preempted.append(request.request_id)

    # -- the automatic prefix cache ----------------------------------------------------------

    def _publish_written(self, record: Record) -> None:
        """The spec's `_publish_written`: cache the full pages each request completed this step,
        in admission order (the round's filled pages, one a slot, and the chunks' pages)."""
        if not self.config.prefix_caching:
            return
        if not record.chunks:
            if record.filled:
                self._publish_round(record.filled)
            return
        page_size, fields = self.config.page_size, self.running.fields
        written = [(admitted, slot, depth, depth + 1) for admitted, slot, depth, _ in record.filled]
        for slot, start, stop in record.chunks:  # (admitted, slot, first page, end page)
            if start // page_size != stop // page_size:
                written.append((int(fields[slot, ADMITTED]), slot, start // page_size, stop // page_size))
        written.sort()
        keys: list[Key] = []
        rows: list[int] = []
        depths: list[int] = []
        for _, slot, first, end in written:
            slot_keys = self.keys.through(slot, self.running.request(slot), end)
            keys += slot_keys[first:end]
            rows += [slot] * (end - first)
            depths += range(first, end)
        pages = get_slots(self.scheduler).tables[rows, depths].tolist()
        self.cache.insert(self.pool, keys, pages, depths)

    def _publish_round(self, filled: list[list[int]]) -> None:
        """`_publish_written` of a step without chunks: the page each request's round filled."""
        filled.sort()  # by admission
        keys = self.keys.of_filled(filled, self.running.request)
        self.cache.insert(self.pool, keys, [row[3] for row in filled], [row[2] for row in filled])

    def _evict(self, pages: int, keep: list[int] | None = None) -> int:
        """The spec's `_evict`: evict, or demote what the host tier wants."""
        if pages <= 0 or not self.config.prefix_caching:
            return 0
        demoted = 0
        if self.host.pages:
            for page in self.cache.victims(self.pool, pages, keep or ()).tolist():
                key, depth = self.cache.entry(page)
                if self.host.wants(page, key):
                    self._hold_demoted(page)
                    self.host.demote(page, key, depth)
                    demoted += 1
        evicted = self.cache.evict(self.pool, pages - demoted, keep or ())
        if evicted and self.host.refused:
            self.host.keep_refused(self.cache.cached_mask())
        return demoted + evicted

    # -- the host tier ------------------------------------------------------------------------

    def _complete_copies(self, done: dict[int, bool], record: Record) -> bool:
        """The spec's `_complete_copies`: whether a failed promotion preempted a request."""
        if not done:
            return False
        failed: list[int] = []
        for copy in list(self.host.copies.values()):
            ok = self._outcome(done, copy)
            if ok is None:
                continue
            if copy.kind == PROMOTE and ok:
                self.cache.insert(self.pool, [copy.key], [copy.page], [copy.depth])
            self.pool.release(copy.page)
            self.host.complete(copy, ok)
            slot = self.running.slots.get(copy.request_id) if copy.request_id is not None else None
            waiting = self.running.waiting.get(slot, ()) if slot is not None else ()
            if slot is None or copy.transfer_id not in waiting:
                continue
            if ok:
                rest = tuple(tid for tid in waiting if tid != copy.transfer_id)
                if rest:
                    self.running.waiting[slot] = rest
                else:
                    del self.running.waiting[slot]
            elif slot not in failed:
                failed.append(slot)
        for slot in sorted(failed, key=self.running.victim_order):  # the latest first: places kept
            self._preempt(slot, record)
        return bool(failed)

    def _hold_demoted(self, page: int) -> None:
        """The demotion's copy holds its device page until it completes."""
        self.pool.retain(page)

    def _outcome(self, done: dict[int, bool], copy: Copy) -> bool | None:
        """What the model reported of `copy`: completed, failed, or None (still in flight)."""
        return done.get(copy.transfer_id)

    def _waits(self, slot: int) -> bool:
        """`slot`'s request waits for promotions (it computes nothing meanwhile)."""
        return slot in self.running.waiting

    def _readable(self, request_id: int) -> int:
        """The spec's `_readable`: the slot of a running request that waits for no copy."""
        slot = self.running.slots.get(request_id)
        if slot is None:
            raise refusals.unknown_request(request_id)
        if slot in self.running.waiting:
            raise refusals.copy_pending(request_id, self._promoted_page(slot))
        return slot

    def _promoted_page(self, slot: int) -> int:
        """A page `slot`'s request waits for."""
        return next(copy.page for copy in self.host.copies.values() if copy.transfer_id in self.running.waiting[slot])

    def _drop_for_the_last(self) -> bool:
        """The spec's `_drop_for_the_last` (a rare path: it reads the abstract states)."""
        if len(self.running.slots) != 1:
            return False
        cached = get_cache_references(self.cache.to_spec())
        identity = droppable(self.store.to_spec(), self.pool.to_spec(), cached)
        return identity is not None and self.store.remove(identity, self.pool)

    def _relieve(self, pages: int, keep: list[int] | None = None) -> int:
        """The spec's `_relieve`: evict cached pages, else reclaim idle named prefixes."""
        evicted = self._evict(max(pages - self.pool.free_count(), 1), keep)
        if evicted:
            return evicted
        spare = self.cache.cached_mask().astype(np.uint32) if self.config.prefix_caching else None
        return self.store.reclaim(self.pool, pages, spare, keep or ())  # `keep`: reused, never counted freed


def _pairs(plan: ArrayWritePlan) -> tuple[tuple[int, int], ...]:
    return tuple(zip(plan.copy_sources.tolist(), plan.copy_destinations.tolist(), strict=True))
