"""The running batch's work in impl's engine: the spec's `kvsched.spec.engine_running` over
impl's parts.

    room         room for every running request's work this step, all or nothing: the decode
                 round's write plan and each running prefill's chunk (strict priority, then
                 admission, within the tokens the decode round leaves); a request waiting for
                 promotions gets none. `undo_room` takes it back until the step commits
    admit        admit newcomers into the tokens left (`Admission.admit`), their chunks after
                 the running ones: the copies every chunk's pages need
    run_model    a planned step's model calls (`StepPlan`), in the model boundary's order: the
                 decode round's copy-on-write copies, the round, the chunks' copies, their
                 prefill: each chunk's sampled token (the round's answers are applied to its
                 slots as it returns, the scheduler's round, and `undo_room` takes them back too)
    commit       the answers: one kernel appends every sampled token to its row, notes the pages
                 the round filled and the requests it finished (`commit_round`); each chunk's
                 tokens are computed, and a chunk that completes its prompt samples the first
                 token, and the request finishes or decodes
    release      finished requests leave, their pages released in one call
    preempt      the victim (`victim`: lowest priority, latest admitted) leaves and re-enters
                 the queue at the front of its class with its tokens and its pages' keys
    fork         a child that shares every page of its parent, copy-on-write

Its state is two buffers for the round's outputs, and the room a step took and the round it ran
until the step commits (`taken`, `ran`: what `undo_room` takes back); the requests are the
running set's.
`StepTokens` is a step's tokens as the output reads them: the round's arrays, read lazily.
`StepPlan` is the spec's (`kvsched.spec.engine_step`) in impl's storage: a step decided before
the model runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.impl.engine_admission import Admission, copy_pairs
from kvsched.impl.engine_host import HostCopies
from kvsched.impl.engine_keys import PageKeys
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
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.impl.scheduler import (
    RequestScheduler,
    finish_slots,
    get_indexes,
    get_slots,
    lower_decode_round,
    round_outputs,
    run_decode_round,
    unapply_decode_round,
    undo_writes,
)
from kvsched.impl.slots import PREFILL
from kvsched.impl.writes import ArrayWritePlan
from kvsched.spec.engine_admission import Shortfall
from kvsched.spec.engine_calls import Chunk, call_model, require_prefill_tokens
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.engine_state import Queued
from kvsched.spec.errors import Exhausted
from kvsched.spec.model import EngineModel, PrefillItem
from kvsched.spec.sequence import FinishReason


@dataclass(slots=True)
class StepPlan:
    """A step decided before the model runs: what it did so far (`record`: its cancellations
    and preemptions), the decode round's write plan (None: the step runs nothing) and the round
    lowered, the chunks to prefill (each with its request's slot), the copies their pages
    need first, and the pages the queue's front was short of."""

    record: Record
    round: ArrayWritePlan | None = None
    count: int = 0  # the requests the round runs, lowered into the scheduler's round buffers
    chunks: list[tuple[Chunk, int]] = field(default_factory=list)
    copies: tuple[tuple[int, int], ...] = ()
    shortfall: Shortfall | None = None  # what the queue's front was short of: relieved at the commit


class Batch:
    """The running batch's work; see the module docstring."""

    __slots__ = (
        "admission",
        "cache",
        "config",
        "done",
        "filled",
        "host_copies",
        "keys",
        "model",
        "pool",
        "queue",
        "ran",
        "running",
        "scheduler",
        "taken",
    )

    def __init__(
        self,
        config: EngineConfig,
        model: EngineModel,
        scheduler: RequestScheduler,
        queue: WaitingQueue,
        running: RunningSet,
        keys: PageKeys,
        admission: Admission,
        host_copies: HostCopies,
    ) -> None:
        self.config, self.model, self.scheduler, self.queue, self.running = config, model, scheduler, queue, running
        self.keys, self.admission, self.host_copies = keys, admission, host_copies
        self.pool: BlockPool = admission.pool
        self.cache: PrefixCache = admission.cache
        self.filled = np.zeros((config.requests, FILLED), dtype=np.int64)  # a round's filled pages
        self.done = np.zeros(config.requests, dtype=np.intp)  # a round's outputs that finished
        # the room a step took and has not committed: the round's plan, and each chunk's plan,
        # slot and count before it
        self.taken: tuple[ArrayWritePlan, list[tuple[ArrayWritePlan, int, int]]] | None = None
        self.ran = 0  # the requests of the round run and applied to their slots, until the commit

    def room(self) -> tuple[ArrayWritePlan, list[tuple[Chunk, int]]]:
        """Room for the running requests' work, all or nothing: the decode round's plan and the
        running prefills' chunks (`Exhausted`, nothing changed, when the pool cannot give it).
        The room stays `taken` until the step commits or `undo_room` takes it back."""
        plan = self.scheduler.prepare_decode_round(self.pool, self.config.page_size)
        chunks: list[tuple[Chunk, int]] = []
        self.taken = plan, []
        if not self.running.prefilling:
            return plan, chunks
        budget = self.admission.token_budget(get_indexes(self.scheduler)[2])
        counts = get_slots(self.scheduler).token_counts
        try:
            for slot in sorted(self.running.prefilling, key=self.running.prefill_order):
                if self.host_copies.waits(slot):
                    continue  # it computes nothing until its promotions complete
                if budget == 0:
                    break
                request = self.running.requests[slot]
                assert request is not None
                computed = int(self.running.fields[slot, COMPUTED])
                length = min(self.config.chunk_size, int(self.running.fields[slot, LENGTH]) - computed, budget)
                count = int(counts[slot])
                room = self.scheduler.record_chunk(request.request_id, length, self.pool)
                self.taken[1].append((room, slot, count))
                chunks.append((Chunk(request.request_id, computed, length, copy_pairs(room)), slot))
                budget -= length
        except Exhausted:
            self.undo_room()
            raise
        return plan, chunks

    def undo_room(self) -> None:
        """Take back the room `room` took and the admissions after it, if they are still taken:
        the admissions (`Admission.undo`), the round's answers if it ran, then each chunk's
        pages and count, the latest first, then the decode round's plan (`undo_writes`: every
        page back in its place on the free stack)."""
        self.admission.undo()
        if self.ran:  # the round ran and a later call failed: its answers first
            unapply_decode_round(self.scheduler, self.ran)
        if self.taken is not None:
            plan, recorded = self.taken
            counts = get_slots(self.scheduler).token_counts
            for room, slot, count in reversed(recorded):
                undo_writes(self.scheduler, room, self.pool)
                counts[slot] = count
            undo_writes(self.scheduler, plan, self.pool)
        self.forget_room()

    def forget_room(self) -> None:
        """The room and the admissions are the step's for good (it committed) or taken back."""
        self.taken, self.ran = None, 0
        self.admission.forget()

    def lower(self) -> int:
        """Lower the decode round on the state the room left, before any admission: how many
        requests it runs."""
        return lower_decode_round(self.scheduler)

    def run_round(self, plan: ArrayWritePlan, count: int) -> None:
        """The decode round's model calls (its copies, then the round of `count` requests
        lowered), its answers applied to their slots (`ran`). A call that fails leaves the slots
        as the plan left them."""
        if count == 0:
            return
        if plan.copy_sources.shape[0]:
            self.copy_round_pages(copy_pairs(plan))
        run_decode_round(self.scheduler, self.model, count)
        self.ran = count

    def copy_round_pages(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """The decode round's copy-on-write copies, before the round."""
        call_model(lambda: self.model.copy_pages(pairs))

    def commit_round(self, count: int, record: Record) -> None:
        """Append the round's `count` sampled tokens to their rows and record them; note the
        pages the round filled and the requests it finished."""
        if count == 0:
            return
        outputs = round_outputs(self.scheduler, count)
        slots, sampled = outputs["slot"], outputs["next_token_id"]
        filled, done = self.filled[:count], self.done[:count]
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
            self.finishing(slot, reason, record)

    def finishing(self, slot: int, reason: FinishReason, record: Record) -> None:
        """`slot`'s request finished: reported now, released at the end of the step."""
        request = self.running.requests[slot]
        assert request is not None
        record.finished[request.request_id] = reason
        record.finishing.append(slot)

    def admit(
        self, count: int, chunks: list[tuple[Chunk, int]], *, newcomers: bool
    ) -> tuple[tuple[tuple[int, int], ...], Shortfall | None]:
        """Admit newcomers (with `newcomers`: the queue holds someone and a seat is free) into the
        tokens the decode round (of `count` requests) and the running `chunks` leave, their chunks
        appended (their pages attached and allocated in one call once all are chosen:
        `Admission.admit`): the copies every chunk's pages need before the chunks run, and what
        the queue's front was short of."""
        copies = tuple(pair for chunk, _ in chunks for pair in chunk.copies) if chunks else ()
        if not newcomers:
            return copies, None
        budget = self.admission.token_budget(count) - sum(chunk.length for chunk, _ in chunks)
        admitted, shortfall = self.admission.admit(budget, chunks)
        return copies + admitted, shortfall

    def run_model(self, plan: StepPlan) -> list[int]:
        """The planned step's model calls, in order: the decode round (its copies, then the
        round), the chunks' copies, their prefill. A call that fails leaves the engine as the
        plan left it, but for the round's answers if the round ran (`ran`: `undo_room` takes
        them back): each chunk's sampled token."""
        if plan.round is None:
            return []
        self.run_round(plan.round, plan.count)
        return self._prefill(plan.chunks, plan.copies) if plan.chunks else []

    def _prefill(self, chunks: list[tuple[Chunk, int]], copies: tuple[tuple[int, int], ...]) -> list[int]:
        """The chunks' copies, then their prefill: each chunk's sampled token."""
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
        return require_prefill_tokens(answer, len(items))

    def commit(self, plan: StepPlan, sampled: list[int]) -> None:
        """Take the model's answers to the planned step: the round's tokens (in the scheduler's
        round buffers), then the chunks' (`sampled`)."""
        self.forget_room()
        record = plan.record
        self.commit_round(plan.count, record)
        for (chunk, slot), token in zip(plan.chunks, sampled, strict=True):
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
            self.finishing(slot, FinishReason.EOS if token == fields[slot, EOS] else FinishReason.MAX_LENGTH, record)
            return
        if get_slots(self.scheduler).states[slot] == PREFILL:
            self.scheduler.mark_prefill_complete(request_id)
        self.scheduler.seed_decode_token(request_id, token)
        fields[slot, DECODING] = 1
        fields[slot, COMPUTED] = length
        self.running.prefilling.discard(slot)

    def release(self, slots: list[int]) -> None:
        """Finish the requests in `slots`, in order (pages released), and free their state slots."""
        if self.config.prefix_caching:
            self.cache.stamp(get_slots(self.scheduler).tables[slots])
        finish_slots(self.scheduler, slots, self.pool)
        for slot in slots:
            self.running.leave(slot)

    def victim(self) -> int | None:
        """The slot preempted first under pressure (None: nobody runs)."""
        return min(self.running.slots.values(), key=self.running.victim_order, default=None)

    def preempt(self, slot: int, record: Record) -> None:
        """`slot`'s request leaves and re-enters the queue at the front of its class."""
        request, generated = self.running.request(slot), self.running.generated(slot)
        self.release([slot])
        # its keys name the same tokens when it is admitted again
        keys = self.keys.slots[slot] if self.config.prefix_caching else None
        self.queue.push(Queued(request, generated), front=True, keys=keys)
        record.preempted.append(request.request_id)

    def fork(self, parent: int, child_id: int) -> None:
        """Run `child_id` as a copy of the request in slot `parent` (the engine checked it may)."""
        parent_id = self.running.request(parent).request_id
        slot = self.scheduler.fork(parent_id, child_id, self.pool)
        running = self.running
        running.tokens[slot] = running.tokens[parent]
        running.fields[slot] = running.fields[parent]
        running.fields[slot, ADMITTED] = running.admissions
        running.fields[slot, STATE_SLOT] = running.take_state_slot(child_id)
        running.admissions += 1
        running.requests[slot] = replace(running.request(parent), request_id=child_id)
        self.keys.slots[slot] = list(self.keys.slots[parent])
        running.slots[child_id] = slot
        if parent in running.prefilling:
            running.prefilling.add(slot)

    def __repr__(self) -> str:
        return f"Batch({len(self.running.slots)} running, {len(self.running.prefilling)} prefilling)"


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
