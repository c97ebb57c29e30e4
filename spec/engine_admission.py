"""The admission policy: who leaves the queue this step, with which cached pages and first chunk.

`admit` admits the queue's front request with its first chunk when everything it needs is free
now: a batch seat, the token budget, a state slot, free pages for the chunk, the memory guard
(free pages >= `prefill_reserve_pages`, or nothing running) and the policy (`admission`; with
"whole_prompt", while anything runs the free pages must hold the rest of its whole sequence and
the pages every running prefill still needs past this step's chunks). Admission stops at the
first request that cannot be admitted, keeping its place: nobody is preempted for a newcomer;
what it is short of (`Shortfall`) is relieved for it at the step's end, once the model's calls
have succeeded (evicted, or idle prefixes reclaimed), and a later step admits it. So admission
only takes pages: a step's plan never gives one back.

A newcomer attaches, in order: a published prefix it names (only when the rest of its sequence
fits the first chunk; a full hit recomputes the last prompt token, so every request prefills at
least one token and samples from its own logits), the longest run of its pages cached on the
device, and the run that continues in the host tier (promoted into fresh pages: the request
waits for those copies and computes nothing meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsched.spec import host_tier
from kvsched.spec import prefix_cache as cache_ops
from kvsched.spec.engine_calls import Chunk, chunk_pages, plan_copies
from kvsched.spec.engine_config import EngineRequest, admission_pages, pages_for, salt_of
from kvsched.spec.engine_host import Promotion
from kvsched.spec.engine_state import Running, sequence_of
from kvsched.spec.engine_work import Work
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.page_keys import Key, page_keys


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The queue's front, not admitted for want of free pages: how many pages it asks to be free,
    and the cached pages it would hit (which the relief at the step's end must not evict)."""

    pages: int
    keep: tuple[int, ...]


def admit(work: Work, budget: int, chunks: Sequence[Chunk]) -> Chunk | Promotion | Shortfall | None:
    """Admit the queue's front request within `budget` tokens, beside the running prefills'
    `chunks`: its first chunk, or the promotion it waits for (issued at the commit); a
    `Shortfall` when only free pages are missing; None when it is not admitted otherwise (see
    the module docstring)."""
    config = work.config
    if not work.queue or len(work.running) >= config.max_batch_size:
        return None
    free = work.pool.free_count()
    if free < config.prefill_reserve_pages and work.running:
        return None  # the memory guard; an empty batch is never starved
    slot = work.free_state_slot()
    if work.state_slots and slot is None:
        return None
    front = work.queue[0]
    request = front.request
    length_of = len(request.prompt) + len(front.generated)
    page_size = config.page_size
    identity, cached = usable_prefix(work, request.prefix, length_of, budget)
    keys = cache_keys(work, request, sequence_of(request, front.generated), cached)
    hit = cache_ops.lookup(work.cache, keys)
    fetch = host_tier.run(work.host, keys[len(hit) :]) if identity is None else ()
    cached += len(hit) * page_size
    fetched = len(fetch) * page_size
    length = min(config.chunk_size, length_of - cached - fetched, budget)
    pages = chunk_pages(cached + fetched, length, page_size)
    needed = max(len(fetch) + len(pages), _admission_pages(work, length_of, cached, chunks))
    if needed > free:
        return Shortfall(needed, tuple(hit))  # relieved at the step's end, for a later step
    request_id = request.request_id
    admission = work.scheduler.admit_with_prefix(request_id, identity, work.store, work.pool)
    if config.prefix_caching:
        if hit:
            work.scheduler.attach_pages(request_id, hit, work.pool)
        work.cache = cache_ops.count_query(work.cache, length_of, len(hit) * page_size)
    promotion = None
    if fetch:  # fresh pages for the host run, counted; it waits for their promotions
        work.scheduler.record_chunk(request_id, fetched, work.pool)
        promotion = Promotion(request_id, fetch, cached // page_size)
        plan = None
    elif admission.prefix_tokens + len(hit) * page_size == cached:
        plan = work.scheduler.record_chunk(request_id, length, work.pool)
    else:  # a full hit recomputes its last prompt token, which the prefix already counts
        plan = work.scheduler.ensure_writable_batch([request_id] * len(pages), pages, work.pool)
    if slot is not None:
        work.own_state_slot(slot, request_id)
    entry = Running(request, front.generated, cached + fetched, False, work.admissions, slot)
    work.admissions += 1
    work.running = (*work.running, entry)
    work.queue = work.queue[1:]
    if promotion is not None:
        return promotion
    return Chunk(request_id, cached + fetched, length, () if plan is None else plan_copies(plan))


def _admission_pages(work: Work, length: int, cached: int, chunks: Sequence[Chunk]) -> int:
    """What the admission policy asks to be free for a newcomer besides its first chunk's
    pages (`admission_pages`): the running prefills still need pages for their tokens past
    this step's `chunks` (whose pages are taken). Nothing while nobody runs: an empty batch is
    never starved."""
    if not work.running:
        return 0
    page_size = work.config.page_size
    recorded = {chunk.request_id: chunk.start + chunk.length for chunk in chunks}
    committed = sum(
        pages_for(entry.sequence_length, page_size)
        - pages_for(recorded.get(entry.request.request_id, entry.computed), page_size)
        for entry in work.running
        if not entry.decoding
    )
    return admission_pages(work.config, length, cached, committed)


def usable_prefix(
    work: Work, identity: PrefixIdentity | None, length: int, budget: int
) -> tuple[PrefixIdentity | None, int]:
    """The prefix to attach and the tokens it saves: published, no longer than the sequence,
    and leaving a rest that one chunk completes; a full hit still recomputes one token."""
    page_set = None if identity is None else work.store.get(identity)
    if page_set is None or page_set.token_count > length:
        return None, 0
    cached = min(page_set.token_count, length - 1)
    if length - cached > min(work.config.chunk_size, budget):
        return None, 0
    return identity, cached


def cache_keys(work: Work, request: EngineRequest, sequence: tuple[int, ...], start: int) -> tuple[Key, ...]:
    """The keys of the sequence's full pages from token `start` (a page boundary, else none), at
    most up to the last page before its last token (which is always computed, so a full hit
    still prefills a token): what the caches are looked up by."""
    page_size = work.config.page_size
    if not work.config.prefix_caching or start % page_size:
        return ()
    pages = (len(sequence) - 1) // page_size
    keys = page_keys(sequence, page_size, salt_of(work.config, request), work.digest, pages)
    return tuple(keys[start // page_size :])
