"""One engine step as a function on values: `run_step(state, config, model) -> (state, output)`.

It is planned, run and committed: `plan_step` decides everything the step does before the model
runs (1-3), `run_model` makes the model calls that plan names (4, `kvsched.spec.engine_calls`),
`commit_step` applies their answers (5-7). The engine (`kvsched.spec.engine`) holds the state
`run_step` returns, and only then; the parts it changes are the engine's (`engine_running`,
`engine_admission`, `engine_cache`, `engine_host`), each over a `Work`.

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
   admitted, keeping its place (what it is short of is relieved at the step's end, 7, and a
   later step admits it). A published prefix is attached only when the rest of the sequence
   fits the first chunk; a full hit recomputes the last prompt token, so every request prefills
   at least one token and samples from its own logits. Each chunk (a running prefill's or an
   admission's, already made room for and counted by one `record_chunk`) becomes one prefill
   item. A newcomer whose pages continue in the host tier gets fresh pages and a `Promotion`,
   issued by the commit (5). The plan only takes pages.
4. The model: copy the shared pages the round must write (`copy_pages`), run the one ragged
   decode round; one `copy_pages` and one `execute_prefill` for every chunk.
5. The commit begins with the host tier: the newcomers' promotions are issued, then the copies
   the model reported done when the step began are applied (a failed promotion preempts its
   request). Decode: each decoding request appends its sampled token; EOS (checked first) or the
   length limit finishes it. Prefill: each chunk's tokens are computed; a chunk that completes its
   sequence samples the next token (and may finish it).
6. Requests that finished this step release their pages and state slots at its end.
7. With the automatic prefix cache (`prefix_caching`; `kvsched.spec.prefix_cache`): the pages
   this step completed were cached before those releases (after the model calls succeeded, so
   a cached page's KV is written), admissions (3) attached the longest cached run of their
   pages, and the step ends by evicting cached pages until `prefill_reserve_pages` are free, for
   the next step (a step never writes a page it freed, evicted ones included). Before that
   eviction, the pages an admission was short of (3) are relieved: cached pages evicted, else
   idle named prefixes reclaimed. Under pressure (2) eviction comes before reclaiming named
   prefixes and before preemption.

Whatever a step raises, `state` is a value and so unchanged. With a host tier, the copies the
model reports done when the step begins are applied by its commit (5-7), and its new copies are
started by its last call, after the commit: a call that raises started none, and each of them
fails at once (`start_copies`) while the step stands (see the engine's atomicity,
`kvsched.spec.engine`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvsched.spec.engine_admission import Shortfall, admit
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
from kvsched.spec.engine_config import EngineConfig, StepOutput
from kvsched.spec.engine_host import Promotion, complete_copies, promote
from kvsched.spec.engine_running import (
    StepRecord,
    preempt,
    prefill_item,
    release,
    room_for_running,
    take_prefills,
    take_round,
)
from kvsched.spec.engine_state import EngineState, victim
from kvsched.spec.engine_work import Work
from kvsched.spec.errors import BackendFailed, Exhausted
from kvsched.spec.host_tier import HostStats
from kvsched.spec.model import EngineModel
from kvsched.spec.plan import WritePlan
from kvsched.spec.prefix_cache import CacheStats
from kvsched.spec.round import lower_round
from kvsched.spec.sequence import FinishReason


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step decided before the model runs: the engine after making room, preempting and
    admitting (no model call has changed it), the calls to make (None: the step only relieved
    pressure and runs nothing), its prefill chunks in call order, the cancellations and
    preemptions it reports, the cache's and host tier's counts before it, what the queue's
    front was short of (relieved once the calls succeed), the copies the model reported done
    and the newcomers' promotions (both applied once the calls succeed)."""

    state: EngineState
    calls: ModelCalls | None
    chunks: tuple[Chunk, ...]
    cancelled: tuple[int, ...]
    preempted: tuple[int, ...]
    stats: CacheStats
    host: HostStats
    shortfall: Shortfall | None = None
    done: Mapping[int, bool] = field(default_factory=dict)
    promotions: tuple[Promotion, ...] = ()


def plan_step(state: EngineState, config: EngineConfig, done: dict[int, bool] | None = None) -> StepPlan:
    """The step `state` takes, decided before any model call (see the module docstring), with
    the copies `done` reports kept for the commit: room for the running requests (under
    pressure: relieve it, preempt, and plan nothing more), the decode round lowered, the
    admissions and every chunk's prefill item. The plan only takes pages: none it gives back is
    written in the step (a relief runs nothing; a shortfall and the copies are the commit's)."""
    work = Work.of(state, config)
    stats, host, cancelled = work.cache.stats, work.host.stats, work.cancelled
    work.cancelled = ()
    done = done or {}
    preempted: list[int] = []
    room = make_room(work, preempted)
    if room is None:
        return StepPlan(work.state, None, (), cancelled, tuple(preempted), stats, host, None, done)
    plan, chunks = room
    items, tables = lower_round(work.scheduler.state, work.pool.state, config.page_size)
    budget = config.max_batched_tokens - len(items) - sum(chunk.length for chunk in chunks)
    shortfall = None
    promotions: list[Promotion] = []
    while budget:
        chunk = admit(work, budget, chunks)
        if chunk is None or isinstance(chunk, Shortfall):
            shortfall = chunk
            break
        if isinstance(chunk, Promotion):  # it waits for its promotions, issued at the commit
            promotions.append(chunk)
            continue
        chunks.append(chunk)
        budget -= chunk.length
    calls = ModelCalls(
        plan_copies(plan) if items else (),
        items,
        tables,
        tuple(pair for chunk in chunks for pair in chunk.copies),
        tuple(prefill_item(work, chunk) for chunk in chunks),
    )
    return StepPlan(
        work.state, calls, tuple(chunks), cancelled, tuple(preempted), stats, host, shortfall, done, tuple(promotions)
    )


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
    the newcomers' promotions issued, the copies the model reported done applied (a failed
    promotion preempts its request), the round's tokens, the chunks' computed tokens and
    samples, the cache's new pages, the finished requests' release, the relief the queue's front
    was short of, and the end-of-step eviction."""
    work = Work.of(plan.state, config)
    record = StepRecord(finished=dict.fromkeys(plan.cancelled, FinishReason.CANCELLED), preempted=list(plan.preempted))
    for promotion in plan.promotions:
        promote(work, promotion)
    complete_copies(work, plan.done, record.preempted)
    if plan.calls is not None:
        take_round(work, answers.outputs, record)
        take_prefills(work, plan.chunks, answers.sampled, record)
        publish_written(work, record)
        for request_id in record.finishing:
            release(work, work.entry(request_id))
    if plan.shortfall is not None:
        relieve(work, plan.shortfall.pages, keep=plan.shortfall.keep)
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


def start_copies(
    plan: StepPlan, state: EngineState, output: StepOutput, issued: int, config: EngineConfig, model: EngineModel
) -> tuple[EngineState, StepOutput]:
    """Start the committed step's new copies (those from transfer id `issued` on) in one call,
    its last. A call that raises started none of them (the protocol: all or nothing): each is
    failed at once, as if the model had reported it failed (a failed demotion's page is refused,
    a failed promotion preempts its request), and the step stands, its output saying so."""
    new = [copy for copy in state.host.copies if copy.transfer_id >= issued]
    try:
        issue_copies(copier(model), new)
    except BackendFailed:
        work = Work.of(state, config)
        preempted = list(output.preempted)
        complete_copies(work, dict.fromkeys((copy.transfer_id for copy in new), False), preempted)
        return work.state, replace(
            output,
            preempted=tuple(preempted),
            pages_in_use=config.pages - work.pool.free_count(),
            cache=work.cache.stats - plan.stats,
            host=work.host.stats - plan.host,
        )
    return state, output


def run_step(state: EngineState, config: EngineConfig, model: EngineModel) -> tuple[EngineState, StepOutput]:
    """One step as a function on values: plan it, make its model calls, commit their answers,
    start its copies. Whatever it raises, `state` is a value and so unchanged: a failed step is
    undone by keeping the state the caller already has. Once its model calls have succeeded it
    stands: copies the model cannot start fail (`start_copies`)."""
    done = poll_copies(copier(model), state.host.copies)
    plan = plan_step(state, config, done)
    answers = NO_ANSWERS if plan.calls is None else run_model(plan.calls, model)
    after, output = commit_step(plan, answers, config)
    return start_copies(plan, after, output, state.host.issued, config, model)
