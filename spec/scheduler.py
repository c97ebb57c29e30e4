"""Request lifecycle: fixed request slots, their page tables, and the ragged decode round.

Modelled: `requests` slots, each `EMPTY`, `PREFILL` or `DECODE`, each with a fixed-capacity
logical page table. Lifecycle:

    EMPTY --admit (prefix miss)--> PREFILL --mark_prefill_complete--> DECODE --round--> DECODE
    EMPTY --admit (prefix hit)---------------------------------------> DECODE
    EMPTY --fork(parent)--> the parent's state           any live --finish--> EMPTY

Promises (the original's, kept exactly): admission checks duplicates before capacity and takes
the lowest empty slot; slot order is stable; a prefix hit goes straight to DECODE (its input
token must still be seeded); a decode round makes exactly one backend call, identity-checks the
whole output batch and only then mutates; cancellation and completion release identically.
Every operation is atomic: on any error the scheduler, pool and store are exactly as before.

Decisions where the original is lax:
- `mark_prefill_complete` requires PREFILL (the original set DECODE unconditionally); from DECODE
  it raises `InvalidState`.
- Token counting: `record_token` counts a token whose KV the caller wrote outside a decode round
  (a prefill chunk, or a prompt suffix after a prefix hit); a decode round counts the token it
  processed. The two never count the same token. Both saturate at 2**32 - 1 as the original does.
- `seed_decode_token` is allowed in PREFILL and DECODE (seeding before the prefill completes is
  how an engine hands over the first sampled token).
- The backend sees every output position set to `UNANSWERED` (slot 2**32 - 1, which no
  scheduler has), so an output it never writes cannot pass as a stale answer from an earlier
  round, nor as an answer for request 0 in slot 0. A backend must not call back into the scheduler during a round.
- The batched forms `ensure_writable_batch` and `prepare_decode_round` (an engine's hot path) are
  defined as the single calls in sequence, all or nothing.
- A decode round writes each request's token at position `token_count`, into logical page
  `token_count // page_size`: the round refuses (`UnpreparedWrite`, before the backend is called)
  unless that page is mapped and held by the request alone, so a round can never write a page
  another owner reads. The page size is the scheduler's own (a constructor argument, fixed);
  without one, every page of the request's table must be held by it alone. The pool is the
  bound one (`kvsched.spec.binding`).
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from kvsched.spec import refusals
from kvsched.spec import table as table_ops
from kvsched.spec.batch import (
    U32_MAX,
    UNANSWERED,
    RaggedBatchItem,
    RaggedBatchOutput,
    RaggedBatchReceipt,
    RaggedDecodeBackend,
)
from kvsched.spec.binding import Binding, bind_together
from kvsched.spec.domain import as_int, require_int, require_size, require_u32, require_u64
from kvsched.spec.errors import Exhausted, InvalidArgument, OutputIdentityMismatch
from kvsched.spec.plan import WritePlan, pages_needed
from kvsched.spec.pool import BlockPool, CopyOnWrite, PoolState, get_ref_count
from kvsched.spec.prefix import PrefixIdentity, PrefixKvStore, StoreState
from kvsched.spec.prefix import attach as attach_prefix
from kvsched.spec.table import Table

MAX_REQUESTS = 2**16  # slots are u16 in the original ABI


class RequestState(Enum):
    """What a request slot is doing."""

    EMPTY = "empty"
    PREFILL = "prefill"
    DECODE = "decode"


LIVE = frozenset({RequestState.PREFILL, RequestState.DECODE})


@dataclass(frozen=True, slots=True)
class Slot:
    """One request slot. Every field but `table` is cleared when the request finishes."""

    table: Table
    request_id: int = 0
    state: RequestState = RequestState.EMPTY
    token_count: int = 0
    prefix_tokens: int = 0
    next_token_id: int = 0
    token_ready: bool = False


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """Every slot, in slot order."""

    slots: tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class Admission:
    """Where a request was admitted and whether a prefix was attached."""

    slot: int
    prefix_hit: bool
    prefix_tokens: int


@dataclass(frozen=True, slots=True)
class RequestView:
    """A live request as callers see it."""

    request_id: int
    slot: int
    state: RequestState
    token_count: int
    prefix_tokens: int


def initial_scheduler(requests: int, logical_pages: int) -> SchedulerState:
    """`requests` empty slots, each with an empty table of `logical_pages` entries."""
    requests = require_size("requests", requests, 1, MAX_REQUESTS)
    return SchedulerState((Slot(table_ops.empty_table(logical_pages)),) * requests)


def is_live(slot: Slot) -> bool:
    """The slot holds a request."""
    return slot.state in LIVE


def get_active_count(state: SchedulerState) -> int:
    """How many slots hold a request."""
    return sum(1 for slot in state.slots if is_live(slot))


def find_request(state: SchedulerState, request_id: int) -> int | None:
    """The slot of the live request `request_id`, if any."""
    for index, slot in enumerate(state.slots):
        if is_live(slot) and slot.request_id == request_id:
            return index
    return None


def find_empty_slot(state: SchedulerState) -> int | None:
    """The lowest empty slot, if any."""
    return next((index for index, slot in enumerate(state.slots) if not is_live(slot)), None)


def _require_request(state: SchedulerState, request_id: int) -> int:
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


def can_admit(state: SchedulerState, request_id: int) -> bool:
    """`request_id` is not live and a slot is empty."""
    return find_request(state, request_id) is None and find_empty_slot(state) is not None


def _with_slot(state: SchedulerState, index: int, slot: Slot) -> SchedulerState:
    return SchedulerState(state.slots[:index] + (slot,) + state.slots[index + 1 :])


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
        raise InvalidArgument("identity must be a PrefixIdentity or None")
    index = _require_free_slot(state, request_id)
    table = state.slots[index].table
    tokens = None
    if identity is not None:
        store, table, pool, tokens = attach_prefix(store, table, pool, identity)
    prefix_tokens = tokens or 0
    request_state = RequestState.DECODE if prefix_tokens else RequestState.PREFILL
    slot = Slot(table, request_id, request_state, prefix_tokens, prefix_tokens)
    admission = Admission(index, prefix_tokens != 0, prefix_tokens)
    return _with_slot(state, index, slot), pool, store, admission


def fork(
    state: SchedulerState, pool: PoolState, parent_id: int, child_id: int
) -> tuple[SchedulerState, PoolState, int]:
    """Admit `child_id` as a copy of `parent_id` sharing all its pages; the child's slot."""
    parent_index = _require_request(state, parent_id)
    child_id = require_u64("child_id", child_id)
    child_index = _require_free_slot(state, child_id)
    parent = state.slots[parent_index]
    table, pool = table_ops.fork(parent.table, state.slots[child_index].table, pool)
    child = replace(parent, table=table, request_id=child_id)
    return _with_slot(state, child_index, child), pool, child_index


def _write_step(
    state: SchedulerState, pool: PoolState, request_id: int, logical_page: int
) -> tuple[SchedulerState, PoolState, tuple[int, int], CopyOnWrite]:
    """`ensure_writable`, also returning the step's target (slot, logical page); an exhausted
    pool is named with the request."""
    index = _require_request(state, request_id)
    slot = state.slots[index]
    try:
        table, pool, action = table_ops.ensure_writable(slot.table, pool, logical_page)
    except Exhausted:
        logical = require_int("logical page", logical_page)
        raise refusals.no_page_for(
            slot.request_id, index, logical, needed=1, free=len(pool.free), pages=len(pool.refs), batch=False
        ) from None
    target = (index, require_int("logical page", logical_page))
    return _with_slot(state, index, replace(slot, table=table)), pool, target, action


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


def require_page_size(page_size: object) -> int:
    """`page_size` as an int in 1..2**32-1, else `InvalidArgument`."""
    size = as_int(page_size)
    if size is None or not 1 <= size <= U32_MAX:
        raise InvalidArgument(f"page_size must be an integer in 1..2**32-1, not {page_size!r}")
    return size


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
    index = _require_request(state, request_id)
    slot = state.slots[index]
    if slot.state is not RequestState.PREFILL:
        raise refusals.not_prefilling(slot.request_id, index, slot.state.value)
    return _with_slot(state, index, replace(slot, state=RequestState.DECODE))


def seed_decode_token(state: SchedulerState, request_id: int, token_id: int) -> SchedulerState:
    """Publish the token the request's next decode step consumes."""
    index = _require_request(state, request_id)
    token = require_u32("token_id", token_id)
    return _with_slot(state, index, replace(state.slots[index], next_token_id=token, token_ready=True))


def record_token(state: SchedulerState, request_id: int) -> tuple[SchedulerState, int]:
    """Count one token written outside a decode round; the new count (saturating)."""
    index = _require_request(state, request_id)
    slot = state.slots[index]
    count = min(slot.token_count + 1, U32_MAX)
    return _with_slot(state, index, replace(slot, token_count=count)), count


def finish(state: SchedulerState, pool: PoolState, request_id: int) -> tuple[SchedulerState, PoolState]:
    """Release every page the request holds and empty its slot (cancel and finish alike)."""
    index = _require_request(state, request_id)
    table, pool = table_ops.release_all(state.slots[index].table, pool)
    return _with_slot(state, index, Slot(table)), pool


def get_views(state: SchedulerState) -> tuple[RequestView, ...]:
    """Every live request, in slot order."""
    return tuple(
        RequestView(slot.request_id, index, slot.state, slot.token_count, slot.prefix_tokens)
        for index, slot in enumerate(state.slots)
        if is_live(slot)
    )


def get_decoding_slots(state: SchedulerState) -> tuple[int, ...]:
    """The indices of DECODE slots, in slot order: the order of a round's items."""
    return tuple(index for index, slot in enumerate(state.slots) if slot.state is RequestState.DECODE)


def require_write_target(state: SchedulerState, pool: PoolState, page_size: int | None, index: int) -> None:
    """The DECODE slot `index` writes its next token's KV at position `token_count`: the page
    holding it must be mapped and held by this request alone, or the write would land in a page
    another owner reads. With no page size to find that page, every page of its table must be."""
    slot = state.slots[index]
    width = len(slot.table)
    if page_size is None:
        for page in table_ops.get_mapped_pages(slot.table):
            holders = get_ref_count(pool, page) or 0
            if holders != 1:
                raise refusals.unprepared_write(slot.request_id, index, slot.token_count, None, page, holders, width)
        return
    logical = slot.token_count // page_size
    target = slot.table[logical] if logical < width else None
    holders = 0 if target is None else get_ref_count(pool, target) or 0
    if target is None or holders != 1:
        raise refusals.unprepared_write(slot.request_id, index, slot.token_count, page_size, target, holders, width)


def require_input_token(state: SchedulerState, index: int) -> None:
    """The DECODE slot `index` has a seeded token to consume."""
    slot = state.slots[index]
    if not slot.token_ready:
        raise refusals.missing_input_token(slot.request_id, index)


def lower_item(state: SchedulerState, index: int, offset: int) -> RaggedBatchItem:
    """The ABI item for the DECODE slot `index` whose table starts at `offset`."""
    require_input_token(state, index)
    slot = state.slots[index]
    return RaggedBatchItem(slot.request_id, index, slot.next_token_id, slot.token_count, offset, len(slot.table))


def check_outputs(
    items: tuple[RaggedBatchItem, ...], receipt: object, outputs: list[RaggedBatchOutput]
) -> RaggedBatchReceipt:
    """The receipt, if the outputs answer exactly these items in order; else raise."""
    if not isinstance(receipt, RaggedBatchReceipt):
        raise refusals.not_a_receipt(receipt)
    if receipt.batch_size != len(items):
        raise refusals.answered_count(receipt.batch_size, len(items))
    if receipt.backend_launches != 1:
        raise refusals.launch_count(receipt.backend_launches)
    for position, (item, output) in enumerate(zip(items, outputs, strict=True)):
        if not isinstance(output, RaggedBatchOutput):
            raise OutputIdentityMismatch(f"output {position} is {type(output).__name__}, not a RaggedBatchOutput")
        if output.request_id != item.request_id or output.slot != item.slot:
            raise refusals.wrong_answer(position, (output.request_id, output.slot), (item.request_id, item.slot))
        if not 0 <= output.next_token_id <= U32_MAX:
            raise OutputIdentityMismatch(f"output {position} token {output.next_token_id} is not a u32")
    return receipt


def require_round_buffers(*buffers: object) -> None:
    """The round's three buffers are lists (mutable sequences), each its own: one list passed as
    two would let the outputs overwrite the items."""
    names = ("item_scratch", "block_table_scratch", "output_scratch")
    for name, buffer in zip(names, buffers, strict=True):
        if not isinstance(buffer, MutableSequence):
            raise InvalidArgument(f"{name} must be a mutable sequence (a list), not {type(buffer).__name__}")
    for index, buffer in enumerate(buffers):
        for other in range(index + 1, len(buffers)):
            if buffers[other] is buffer:
                raise InvalidArgument(
                    f"{names[index]} and {names[other]} share memory: each round buffer needs its own"
                )


def apply_outputs(state: SchedulerState, outputs: list[RaggedBatchOutput]) -> SchedulerState:
    """Commit a checked round: each request consumes its token and gets the next one."""
    for output in outputs:
        slot = state.slots[output.slot]
        advanced = replace(
            slot,
            next_token_id=output.next_token_id,
            token_count=min(slot.token_count + 1, U32_MAX),
            token_ready=True,
        )
        state = _with_slot(state, output.slot, advanced)
    return state


class RequestScheduler:
    """Fixed-capacity request scheduler; `requests` is the hard concurrent request bound. Bound
    to one pool and one prefix store (`kvsched.spec.binding`): those it is constructed with, or
    the first a call succeeds with. Its rounds find each write target with `page_size`, fixed at
    construction (without one, a decoding request's pages must all be its own)."""

    def __init__(
        self,
        requests: int,
        logical_pages: int,
        *,
        pool: BlockPool | None = None,
        prefixes: PrefixKvStore | None = None,
        page_size: int | None = None,
    ) -> None:
        self._state = initial_scheduler(requests, logical_pages)
        self._pool = Binding(BlockPool, "scheduler")
        self._store = Binding(PrefixKvStore, "scheduler")
        self._page_size = None if page_size is None else require_page_size(page_size)
        bind_together(self._pool, self._store, pool, prefixes)

    def check_pool(self, pool: object) -> BlockPool:
        """`pool`, if this scheduler may work with it; else `InvalidArgument`."""
        return self._pool.check("pool", pool)

    def _bind(self, pool: BlockPool | None, store: PrefixKvStore | None = None) -> None:
        """Record the bindings of a call that succeeded."""
        if pool is not None:
            self._pool.bind(pool)
        if store is not None:
            self._store.bind(store)
            if pool is not None:
                store.bind_pool(pool)

    @property
    def state(self) -> SchedulerState:
        """The whole scheduler state (a frozen value)."""
        return self._state

    def commit(self, state: SchedulerState) -> None:
        """Install a state produced by a spec transition."""
        self._state = state

    @property
    def requests(self) -> int:
        """The number of request slots."""
        return len(self._state.slots)

    @property
    def logical_pages(self) -> int:
        """Every request table's capacity."""
        return len(self._state.slots[0].table)

    def active_count(self) -> int:
        """How many requests are live."""
        return get_active_count(self._state)

    def admit_with_prefix(
        self, request_id: int, identity: PrefixIdentity | None, prefixes: PrefixKvStore, pool: BlockPool
    ) -> Admission:
        """Admit a request and atomically attach its prefix pages when published."""
        prefixes = self._store.check("prefixes", prefixes)
        pool = prefixes.check_pool(self._pool.check("pool", pool))
        self._state, pool_state, store_state, admission = admit(
            self._state, pool.state, prefixes.state, request_id, identity
        )
        pool.commit(pool_state)
        prefixes.commit(store_state)
        self._bind(pool, prefixes)
        return admission

    def fork(self, parent_id: int, child_id: int, pool: BlockPool) -> int:
        """Admit `child_id` sharing every page of `parent_id` (copy-on-write on first write)."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, slot = fork(self._state, pool.state, parent_id, child_id)
        pool.commit(pool_state)
        self._bind(pool)
        return slot

    def ensure_writable(self, request_id: int, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        """Make a logical page writable; a `Copy` tells the backend to copy the KV page first."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, action = ensure_writable(self._state, pool.state, request_id, logical_page)
        pool.commit(pool_state)
        self._bind(pool)
        return action

    def ensure_writable_batch(
        self, request_ids: Sequence[int], logical_pages: Sequence[int], pool: BlockPool
    ) -> WritePlan:
        """`ensure_writable` for every pair in order, all or nothing; the steps' plan."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, plan = ensure_writable_batch(self._state, pool.state, request_ids, logical_pages)
        pool.commit(pool_state)
        self._bind(pool)
        return plan

    def prepare_decode_round(self, pool: BlockPool, page_size: int) -> WritePlan:
        """Make room for every decoding request's next token, in slot order, all or nothing."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, plan = prepare_decode_round(self._state, pool.state, page_size)
        pool.commit(pool_state)
        self._bind(pool)
        return plan

    def mark_prefill_complete(self, request_id: int) -> None:
        """Move a PREFILL request to DECODE."""
        self._state = mark_prefill_complete(self._state, request_id)

    def seed_decode_token(self, request_id: int, token_id: int) -> None:
        """Publish the token consumed by the request's next decode step."""
        self._state = seed_decode_token(self._state, request_id, token_id)

    def record_token(self, request_id: int) -> int:
        """Count one token written outside a decode round; the new count."""
        self._state, count = record_token(self._state, request_id)
        return count

    def page_table(self, request_id: int) -> Table:
        """The request's logical page table (`None` where unmapped)."""
        return self._state.slots[_require_request(self._state, request_id)].table

    def runnable_into(self, out: MutableSequence[RequestView]) -> int:
        """Write every live request into `out` in slot order; how many were written."""
        views = get_views(self._state)
        if len(out) < len(views):
            raise refusals.views_too_small(len(out), len(views))
        for index, view in enumerate(views):
            out[index] = view
        return len(views)

    def execute_decode_round(
        self,
        backend: RaggedDecodeBackend,
        item_scratch: MutableSequence[RaggedBatchItem],
        block_table_scratch: MutableSequence[int],
        output_scratch: MutableSequence[RaggedBatchOutput],
    ) -> RaggedBatchReceipt:
        """Run one ragged decode round with exactly one backend call.

        DECODE requests are lowered in slot order; their whole tables are concatenated into
        `block_table_scratch` and each item carries its offset. The outputs are checked as a
        complete batch before any request changes; an empty round calls no backend.
        """
        require_round_buffers(item_scratch, block_table_scratch, output_scratch)
        decoding = get_decoding_slots(self._state)
        bound = self._pool.bound
        count, width = len(decoding), self.logical_pages
        if len(item_scratch) < count:
            raise refusals.items_too_small(len(item_scratch), count)
        if len(output_scratch) < count:
            raise refusals.outputs_too_small(len(output_scratch), count)
        if len(block_table_scratch) < count * width:
            raise refusals.tables_too_small(len(block_table_scratch), count, count * width)
        for index in decoding:
            require_input_token(self._state, index)
        if bound is not None:  # no pool bound: no request was ever admitted, none decodes
            for index in decoding:
                require_write_target(self._state, bound.state, self._page_size, index)
        for position, index in enumerate(decoding):
            item_scratch[position] = lower_item(self._state, index, position * width)
            block_table_scratch[position * width : (position + 1) * width] = table_ops.to_abi(
                self._state.slots[index].table
            )
        if count == 0:
            return RaggedBatchReceipt()
        items = tuple(item_scratch[:count])
        outputs = [UNANSWERED] * count
        try:
            receipt = backend.execute_ragged(items, tuple(block_table_scratch[: count * width]), outputs)
        except Exception as error:
            raise refusals.backend_raised(error) from error
        finally:
            for position in range(min(count, len(outputs))):
                output_scratch[position] = outputs[position]
        if len(outputs) != count:
            raise refusals.outputs_resized(len(outputs), count)
        receipt = check_outputs(items, receipt, outputs)
        self._state = apply_outputs(self._state, outputs)
        return receipt

    def finish(self, request_id: int, pool: BlockPool) -> None:
        """Release the request's pages and empty its slot; cancellation is identical."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state = finish(self._state, pool.state, request_id)
        pool.commit(pool_state)
        self._bind(pool)
