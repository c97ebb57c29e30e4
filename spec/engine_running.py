"""The running requests and their chunks: room for a step's work, what the model's answers do to
each request, release and preemption.

    room_for_running  room for every decoding request's next token (`prepare_decode_round`) and
                      each running prefill's next chunk (strict priority, then admission order;
                      one `record_chunk` per chunk, within the budget the decode tokens leave);
                      a request waiting for promotions gets no chunk. `Exhausted` when it does
                      not all fit (the work is then half changed: the step drops it)
    take_round        the decode round's outputs: each request consumes its token, samples one
    take_prefills     each chunk's tokens are computed; one that completes its sequence samples
    release           finish a request in the scheduler (its cached pages stamped as used now)
                      and free its state slot
    preempt           release it and requeue it at the front of its class, its tokens kept
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.batch import RaggedBatchOutput
from kvsched.spec.engine_calls import Chunk, plan_copies
from kvsched.spec.engine_config import finish_reason
from kvsched.spec.engine_state import Queued, Running, enqueue, prefill_order, sequence_of
from kvsched.spec.engine_work import Work
from kvsched.spec.model import PrefillItem
from kvsched.spec.plan import WritePlan
from kvsched.spec.round import commit_round
from kvsched.spec.sequence import FinishReason
from kvsched.spec.slots import RequestState


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


def room_for_running(work: Work) -> tuple[WritePlan, list[Chunk]]:
    """Room for the decode round and the running prefills' chunks: the round's write plan and
    the chunks, each made room for and counted."""
    plan = work.scheduler.prepare_decode_round(work.pool, work.config.page_size)
    budget = work.config.max_batched_tokens - sum(1 for entry in work.running if entry.decoding)
    chunks = []
    for entry in sorted((entry for entry in work.running if not entry.decoding), key=prefill_order):
        if entry.waiting:
            continue  # it computes nothing until its promotions complete
        if budget == 0:
            break
        request_id = entry.request.request_id
        length = min(work.config.chunk_size, entry.sequence_length - entry.computed, budget)
        room = work.scheduler.record_chunk(request_id, length, work.pool)  # made room for and counted
        chunks.append(Chunk(request_id, entry.computed, length, plan_copies(room)))
        budget -= length
    return plan, chunks


def prefill_item(work: Work, chunk: Chunk) -> PrefillItem:
    """The model's prefill item for `chunk`."""
    entry = work.entry(chunk.request_id)
    tokens = sequence_of(entry.request, entry.generated)[chunk.start : chunk.start + chunk.length]
    table = work.scheduler.page_table(chunk.request_id)
    return PrefillItem(chunk.request_id, work.slot_of(chunk.request_id), tokens, chunk.start, table)


def take_round(work: Work, outputs: Sequence[RaggedBatchOutput], record: StepRecord) -> None:
    """The decode round's checked outputs: each request consumes its token and samples one."""
    if not outputs:
        return
    work.scheduler.commit(commit_round(work.scheduler.state, list(outputs)))
    record.tokens_run += len(outputs)
    for output in outputs:
        entry = work.entry(output.request_id)
        record.written[output.request_id] = (entry.computed, entry.computed + 1)
        emit(work, entry, output.next_token_id, record)


def take_prefills(work: Work, chunks: Sequence[Chunk], sampled: Sequence[int], record: StepRecord) -> None:
    """Each chunk's tokens are computed; one that completes its sequence samples."""
    for chunk, token in zip(chunks, sampled, strict=True):
        entry = work.entry(chunk.request_id)
        record.written[chunk.request_id] = (chunk.start, chunk.start + chunk.length)
        computed = chunk.start + chunk.length
        record.tokens_run += chunk.length
        entry = work.replace(entry, computed=computed)
        if computed == entry.sequence_length:
            emit(work, entry, token, record)


def emit(work: Work, entry: Running, token: int, record: StepRecord) -> None:
    """Append the token `entry` sampled; finish it (released at the end of the step), or make it
    (keep it) decoding."""
    request_id = entry.request.request_id
    generated = (*entry.generated, token)
    record.tokens.setdefault(request_id, []).append(token)
    reason = finish_reason(entry.request, generated)
    if reason is not None:
        record.finished[request_id] = reason
        record.finishing.append(request_id)
        return
    if not entry.decoding:
        if work.scheduler.state.slots[work.slot_of(request_id)].state is RequestState.PREFILL:
            work.scheduler.mark_prefill_complete(request_id)
        work.scheduler.seed_decode_token(request_id, token)
    work.replace(entry, generated=generated, computed=entry.sequence_length, decoding=True)


def release(work: Work, entry: Running) -> None:
    """Finish `entry` in the scheduler (pages released; the cached ones stamped as used now) and
    free its state slot."""
    if work.config.prefix_caching:
        table = work.scheduler.page_table(entry.request.request_id)
        work.cache = cache_ops.stamp(work.cache, [page for page in table if page is not None])
    work.scheduler.finish(entry.request.request_id, work.pool)
    if entry.state_slot is not None:
        work.own_state_slot(entry.state_slot, None)
    work.running = tuple(other for other in work.running if other is not entry)


def preempt(work: Work, entry: Running, preempted: list[int]) -> None:
    """Release `entry` and requeue it at the front of its class, its tokens kept."""
    release(work, entry)
    work.queue = enqueue(work.queue, Queued(entry.request, entry.generated), front=True)
    preempted.append(entry.request.request_id)
