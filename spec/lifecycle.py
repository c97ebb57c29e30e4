"""The request lifecycle as pure transitions: admission, copy-on-write, token accounting, finish.

Each takes the scheduler's state (and the pool's and store's where they change) and returns the
new ones, or raises with nothing changed. Promises (the original's, kept exactly): admission
checks duplicates before capacity and takes the lowest empty slot; a prefix hit goes straight
to DECODE (its input token must still be seeded); cancellation and completion release
identically.

Decisions where the original is lax:
- `mark_prefill_complete` requires PREFILL (the original set DECODE unconditionally); from DECODE
  it raises `InvalidState`.
- Token counting: `record_token` counts a token whose KV the caller wrote outside a decode round
  (a prefill chunk, or a prompt suffix after a prefix hit); a decode round counts the token it
  processed. The two never count the same token. Both saturate at 2**32 - 1 as the original does.
- `seed_decode_token` is allowed in PREFILL and DECODE (seeding before the prefill completes is
  how an engine hands over the first sampled token).
- The batched forms `ensure_writable_batch`, `prepare_decode_round` and `record_chunk` (an
  engine's hot path) are defined as the single calls in sequence, all or nothing; an exhausted pool names the request
  whose step found no page and the new pages the whole call needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvsched.spec import refusals
from kvsched.spec import table as table_ops
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import as_int, require_u32, require_u64
from kvsched.spec.errors import Exhausted, InvalidArgument
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.plan import WritePlan, pages_needed
from kvsched.spec.pool import CopyOnWrite, PoolState
from kvsched.spec.prefix import StoreState
from kvsched.spec.prefix import attach as attach_prefix
from kvsched.spec.slots import (
    Admission,
    RequestState,
    SchedulerState,
    Slot,
    find_empty_slot,
    find_request,
    get_decoding_slots,
    require_page_size,
    with_slot,
)


def require_request(state: SchedulerState, request_id: int) -> int:
    """The slot of the live request `request_id`, or `UnknownRequest` (`InvalidArgument` for a
    value that is no id)."""
    request_id = require_u64("request_id", request_id)
    index = find_request(state, request_id)
    if index is None:
        raise refusals.unknown_request(request_id)
    return index


def _require_free_slot(state: SchedulerState, request_id: int) -> int:
    if find_request(state, request_id) is not None:
        raise refusals.duplicate_request(request_id)
    index = find_empty_slot(state)
    if index is None:
        raise refusals.scheduler_full(request_id, len(state.slots))
    return index


def admit(
    state: SchedulerState,
    pool: PoolState,
    store: StoreState,
    request_id: int,
    identity: PrefixIdentity | None,
) -> tuple[SchedulerState, PoolState, StoreState, Admission]:
    """Admit into the lowest empty slot, attaching the prefix `identity` names when published."""
    request_id = require_u64("request_id", request_id)
    if identity is not None and not isinstance(identity, PrefixIdentity):
        raise refusals.wrong_kind("identity", "PrefixIdentity or None", identity)
    index = _require_free_slot(state, request_id)
    table = state.slots[index].table
    tokens = None
    if identity is not None:
        store, table, pool, tokens = attach_prefix(store, table, pool, identity)
    prefix_tokens = tokens or 0
    request_state = RequestState.DECODE if prefix_tokens else RequestState.PREFILL
    slot = Slot(
        table=table, request_id=request_id, state=request_state, token_count=prefix_tokens, prefix_tokens=prefix_tokens
    )
    admission = Admission(slot=index, prefix_hit=prefix_tokens != 0, prefix_tokens=prefix_tokens)
    return with_slot(state, index, slot), pool, store, admission


def attach_pages(
    state: SchedulerState, pool: PoolState, request_id: int, pages: Sequence[int], page_size: int
) -> tuple[SchedulerState, PoolState]:
    """Share `pages` (full pages holding the request's next tokens, found in a cache) into the
    request's table after its mapped pages, and count their tokens as prefix tokens. The
    request's count must end its mapped pages exactly (`InvalidState` otherwise)."""
    index = require_request(state, request_id)
    slot = state.slots[index]
    mapped = table_ops.mapped_run(slot.table)
    if mapped is None or slot.token_count != mapped * page_size:
        raise refusals.not_page_aligned(slot.request_id, index, slot.token_count, page_size)
    table, pool = table_ops.append_shared(slot.table, pool, pages)
    tokens = len(pages) * page_size
    slot = replace(slot, table=table, token_count=slot.token_count + tokens, prefix_tokens=slot.prefix_tokens + tokens)
    return with_slot(state, index, slot), pool


def fork(
    state: SchedulerState, pool: PoolState, parent_id: int, child_id: int
) -> tuple[SchedulerState, PoolState, int]:
    """Admit `child_id` as a copy of `parent_id` sharing all its pages; the child's slot."""
    parent_index = require_request(state, parent_id)
    child_id = require_u64("child_id", child_id)
    child_index = _require_free_slot(state, child_id)
    parent = state.slots[parent_index]
    table, pool = table_ops.fork(parent.table, state.slots[child_index].table, pool)
    child = replace(parent, table=table, request_id=child_id)
    return with_slot(state, child_index, child), pool, child_index


def _write_step(
    state: SchedulerState, pool: PoolState, request_id: int, logical_page: int
) -> tuple[SchedulerState, PoolState, tuple[int, int], CopyOnWrite]:
    """`ensure_writable`, also returning the step's target (slot, logical page); an exhausted
    pool is named with the request."""
    index = require_request(state, request_id)
    slot = state.slots[index]
    logical = table_ops.require_logical_page(slot.table, logical_page)
    try:
        table, pool, action = table_ops.ensure_writable(slot.table, pool, logical)
    except Exhausted:
        raise refusals.no_page_for(
            slot.request_id, index, logical, needed=1, free=len(pool.free), pages=len(pool.refs), batch=False
        ) from None
    return with_slot(state, index, replace(slot, table=table)), pool, (index, logical), action


def ensure_writable(
    state: SchedulerState, pool: PoolState, request_id: int, logical_page: int
) -> tuple[SchedulerState, PoolState, CopyOnWrite]:
    """Make one of the request's logical pages exclusively its own."""
    state, pool, _, action = _write_step(state, pool, request_id, logical_page)
    return state, pool, action


def valid_steps(state: SchedulerState, ids: Sequence[object], pages: Sequence[object]) -> list[tuple[int, int]]:
    """The targets (slot, logical page) of the batch's steps before its first invalid one (an id
    not live, a logical page that is not an integer in its table)."""
    steps: list[tuple[int, int]] = []
    for request_id, logical_page in zip(ids, pages, strict=True):
        number, logical = as_int(request_id), as_int(logical_page)
        index = None if number is None else find_request(state, number)
        if index is None or logical is None or not 0 <= logical < len(state.slots[index].table):
            break
        steps.append((index, logical))
    return steps


def batch_exhausted(
    state: SchedulerState, pool: PoolState, steps: Sequence[tuple[int, int]], failed: tuple[int, int]
) -> Exhausted:
    """The refusal of a batch whose step `failed` found no free page in `pool`: it names that
    request and how many new pages the batch's valid `steps` need."""
    mapped = [(target, state.slots[target[0]].table[target[1]]) for target in steps]
    needed = pages_needed(mapped, lambda page: pool.refs[page])
    index, logical = failed
    return refusals.no_page_for(
        state.slots[index].request_id,
        index,
        logical,
        needed=needed,
        free=len(pool.free),
        pages=len(pool.refs),
        batch=True,
    )


def ensure_writable_batch(
    state: SchedulerState, pool: PoolState, request_ids: Sequence[int], logical_pages: Sequence[int]
) -> tuple[SchedulerState, PoolState, WritePlan]:
    """`ensure_writable` for each (request, logical page) pair in order, all or nothing.

    Each step sees the effects of the earlier ones; the first failing step's error is raised (an
    exhausted pool names the request and the new pages the whole batch needs).
    """
    ids, pages = list(request_ids), list(logical_pages)
    if len(ids) != len(pages):
        raise InvalidArgument(f"{len(ids)} request ids but {len(pages)} logical pages")
    before, pool_before = state, pool
    targets: list[tuple[int, int]] = []
    actions: list[CopyOnWrite] = []
    for request_id, logical_page in zip(ids, pages, strict=True):
        try:
            state, pool, target, action = _write_step(state, pool, request_id, logical_page)
        except Exhausted as error:
            assert error.slot is not None and error.logical_page is not None
            failed = (error.slot, error.logical_page)
            raise batch_exhausted(before, pool_before, valid_steps(before, ids, pages), failed) from None
        targets.append(target)
        actions.append(action)
    return state, pool, WritePlan(targets, actions)


def prepare_decode_round(
    state: SchedulerState, pool: PoolState, page_size: int
) -> tuple[SchedulerState, PoolState, WritePlan]:
    """Make every DECODE request's next token page (`token_count // page_size`) writable, in slot
    order, all or nothing: what an engine does before each decode round."""
    page_size = require_page_size(page_size)
    decoding = [state.slots[index] for index in get_decoding_slots(state)]
    ids = [slot.request_id for slot in decoding]
    return ensure_writable_batch(state, pool, ids, [slot.token_count // page_size for slot in decoding])


def mark_prefill_complete(state: SchedulerState, request_id: int) -> SchedulerState:
    """PREFILL -> DECODE."""
    index = require_request(state, request_id)
    slot = state.slots[index]
    if slot.state is not RequestState.PREFILL:
        raise refusals.not_prefilling(slot.request_id, index, slot.state.value)
    return with_slot(state, index, replace(slot, state=RequestState.DECODE))


def seed_decode_token(state: SchedulerState, request_id: int, token_id: int) -> SchedulerState:
    """Publish the token the request's next decode step consumes."""
    index = require_request(state, request_id)
    token = require_u32("token_id", token_id)
    return with_slot(state, index, replace(state.slots[index], next_token_id=token, token_ready=True))


def record_tokens(state: SchedulerState, request_id: int, tokens: int) -> tuple[SchedulerState, int]:
    """Count `tokens` tokens written outside a decode round (a prefill chunk: `record_token`
    `tokens` times, in one step); the new count (saturating at 2**32 - 1)."""
    index = require_request(state, request_id)
    tokens = require_u32("tokens", tokens)
    slot = state.slots[index]
    count = min(slot.token_count + tokens, U32_MAX)
    return with_slot(state, index, replace(slot, token_count=count)), count


def chunk_steps(count: int, tokens: int, page_size: int, width: int) -> range:
    """The logical pages positions `count .. count + tokens - 1` land on (none for no tokens),
    up to the first outside a table of `width` pages (where the batch stops)."""
    if tokens == 0:
        return range(0)
    first = count // page_size
    return range(first, min((count + tokens - 1) // page_size, max(width, first)) + 1)


def record_chunk(
    state: SchedulerState, pool: PoolState, request_id: int, tokens: int, page_size: int
) -> tuple[SchedulerState, PoolState, WritePlan]:
    """A prefill chunk in one step: make every page its `tokens` next positions land on
    writable (`ensure_writable_batch`), then count them (`record_tokens`), all or nothing."""
    index = require_request(state, request_id)
    tokens = require_u32("tokens", tokens)
    slot = state.slots[index]
    pages = list(chunk_steps(slot.token_count, tokens, page_size, len(slot.table)))
    state, pool, plan = ensure_writable_batch(state, pool, [slot.request_id] * len(pages), pages)
    state, _ = record_tokens(state, request_id, tokens)
    return state, pool, plan


def record_token(state: SchedulerState, request_id: int) -> tuple[SchedulerState, int]:
    """Count one token written outside a decode round; the new count (saturating)."""
    return record_tokens(state, request_id, 1)


def finish(state: SchedulerState, pool: PoolState, request_id: int) -> tuple[SchedulerState, PoolState]:
    """Release every page the request holds and empty its slot (cancel and finish alike)."""
    index = require_request(state, request_id)
    table, pool = table_ops.release_all(state.slots[index].table, pool)
    return with_slot(state, index, Slot(table=table)), pool
