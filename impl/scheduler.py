"""Request lifecycle over struct-of-arrays slots: admission, copy-on-write, rounds, finish.

Refines `kvsched.spec.scheduler`: `to_spec()` maps the slot arrays (see `slots`) to the spec's
`SchedulerState`, slot by slot. Besides the arrays the scheduler keeps three indexes, each a
function of the arrays (representation invariants, checked by `kvsched.impl.refinement`):

    slot_of    dict request id -> slot, exactly the live slots
    empty      min-heap of exactly the EMPTY slots: admission takes its top, the lowest
    decoding   how many slots are in DECODE (a round's batch size, known before lowering)

Every operation validates before it mutates, or undoes what it did, so on any error the
scheduler, the pool and the store are exactly as before (the spec's atomicity).
"""

from __future__ import annotations

import heapq
from collections.abc import MutableSequence, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kvsched.abi import ArrayDecodeBackend, empty_items, empty_outputs
from kvsched.impl.lowering import execute_round, lower_decode, require_disjoint, require_scratch, run_lowered
from kvsched.impl.page_kernels import undo_rows
from kvsched.impl.pool import BlockPool, get_arrays, release_array, retain_array
from kvsched.impl.prefix import PrefixKvStore, attach_row
from kvsched.impl.slots import (
    DECODE,
    PREFILL,
    REQUEST_STATES,
    SlotArrays,
    clear_slot,
    copy_slot,
    new_slot_arrays,
    to_spec_slots,
)
from kvsched.impl.table import (
    TableRow,
    append_row_shared,
    fork_row,
    mapped_run,
    release_row,
    require_logical_page,
    to_spec_table,
)
from kvsched.impl.writes import (
    ArrayWritePlan,
    ensure_writable_batch,
    ensure_writable_range,
    new_write_buffers,
    prepare_decode_round,
    run_steps,
)
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK, U32_MAX, RaggedBatchReceipt
from kvsched.spec.binding import Binding, bind_together
from kvsched.spec.domain import require_int, require_u32, require_u64
from kvsched.spec.errors import Exhausted
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.lifecycle import chunk_steps
from kvsched.spec.pool import Copy, CopyOnWrite
from kvsched.spec.slots import Admission, RequestView, SchedulerState, initial_scheduler, require_page_size
from kvsched.spec.table import Table


class RequestScheduler:
    """Fixed-capacity request scheduler; `requests` is the hard concurrent request bound.

    Complexity: `ensure_writable`, `mark_prefill_complete`, `seed_decode_token`, `record_token`
    and `active_count` are O(1); `admit_with_prefix` is O(log requests), plus O(logical pages)
    when it attaches a prefix; `finish` and `fork` are O(logical pages + log requests);
    `prepare_decode_round` is O(requests) and `execute_decode_round` O(decoding requests x
    logical pages) (the tables are copied into the batch), each one compiled kernel call for
    the bookkeeping; `ensure_writable_batch` is O(steps) (a Python pass that validates, then
    one kernel); `runnable_into` is O(live log live); `page_table` O(logical pages) and
    `to_spec` O(whole state).
    Storage (slots, tables, scratch, round buffers) is allocated at construction.
    Ordering promises (the spec's): admission checks duplicates before capacity and takes the
    lowest empty slot; views and round items are in slot order; a prefix hit admits into DECODE.
    Not thread-safe; a backend must not call back into the scheduler during a round.
    Bound to one pool and one prefix store (`kvsched.spec.binding`); rounds find write targets with
    the page size fixed at construction, as the spec's.
    """

    __slots__ = (
        "_decoding",
        "_empty",
        "_items",
        "_outputs",
        "_page_size",
        "_pool",
        "_round_slots",
        "_slot_of",
        "_slots",
        "_store",
        "_tables",
        "_writes",
    )

    def __init__(
        self,
        requests: int,
        logical_pages: int,
        *,
        pool: BlockPool | None = None,
        prefixes: PrefixKvStore | None = None,
        page_size: int | None = None,
    ) -> None:
        initial_scheduler(requests, 1)  # the spec's checks and messages, in its order
        initial_scheduler(1, logical_pages)
        requests, logical_pages = require_int("requests", requests), require_int("logical_pages", logical_pages)
        self._pool = Binding(BlockPool, "scheduler")
        self._store = Binding(PrefixKvStore, "scheduler")
        self._page_size = None if page_size is None else require_page_size(page_size)
        bind_together(self._pool, self._store, pool, prefixes)
        self._slots = new_slot_arrays(requests, logical_pages)
        self._slot_of: dict[int, int] = {}
        self._empty: list[int] = list(range(requests))  # ascending: already a heap
        self._decoding = 0
        self._items = empty_items(requests)
        self._tables = np.zeros(requests * logical_pages, dtype=np.uint32)
        self._outputs = empty_outputs(requests)
        self._round_slots = np.zeros(requests, dtype=np.int64)
        self._writes = new_write_buffers(requests)

    @property
    def requests(self) -> int:
        """The number of request slots."""
        return int(self._slots.states.shape[0])

    @property
    def logical_pages(self) -> int:
        """Every request table's capacity."""
        return int(self._slots.tables.shape[1])

    @property
    def state(self) -> SchedulerState:
        """The abstract state (`to_spec()`); O(whole state)."""
        return self.to_spec()

    def to_spec(self) -> SchedulerState:
        """The abstraction function: this scheduler as the spec's `SchedulerState`."""
        return to_spec_slots(self._slots)

    def active_count(self) -> int:
        """How many requests are live."""
        return len(self._slot_of)

    def check_pool(self, pool: object) -> BlockPool:
        """`pool`, if this scheduler may work with it (the bound one: one identity test); else
        `InvalidArgument`."""
        bound = self._pool.bound
        return bound if pool is bound and bound is not None else self._pool.check("pool", pool)

    def _require_request(self, request_id: int) -> int:
        # Only valid u64 ids are keys, so a plain int's hit needs no domain check; any other
        # integer is looked up as the int it denotes, and a miss gets the spec's error.
        slot = self._slot_of.get(request_id) if type(request_id) is int else None
        if slot is None:
            request_id = require_u64("request_id", request_id)
            slot = self._find(request_id)
            if slot is None:
                raise refusals.unknown_request(request_id)
        return slot

    def _find(self, request_id: int) -> int | None:
        """The slot of the request a u64 id names, if it is live."""
        return self._slot_of.get(request_id)

    def _require_free_slot(self, request_id: int) -> int:
        self._refuse_duplicate(request_id)
        self._refuse_full(request_id)
        return self._lowest_empty()

    def _refuse_duplicate(self, request_id: int) -> None:
        if request_id in self._slot_of:
            raise refusals.duplicate_request(request_id)

    def _refuse_full(self, request_id: int) -> None:
        if not self._empty:
            raise refusals.scheduler_full(request_id, self.requests)

    def _lowest_empty(self) -> int:
        return self._empty[0]

    def _occupy(self, slot: int, request_id: int, state: int) -> None:
        heapq.heappop(self._empty)
        self._slot_of[request_id] = slot
        self._slots.request_ids[slot] = request_id
        self._slots.states[slot] = state
        self._decoding += state == DECODE

    def admit_with_prefix(
        self, request_id: int, identity: PrefixIdentity | None, prefixes: PrefixKvStore, pool: BlockPool
    ) -> Admission:
        """Admit a request into the lowest empty slot, attaching its prefix pages when published."""
        if prefixes is not self._store.bound or prefixes is None:
            prefixes = self._store.check("prefixes", prefixes)
        pool = prefixes.check_pool(self.check_pool(pool))
        request_id = require_u64("request_id", request_id)
        if identity is not None and not isinstance(identity, PrefixIdentity):
            raise refusals.wrong_kind("identity", "PrefixIdentity or None", identity)
        slot = self._require_free_slot(request_id)
        tokens = None
        if identity is not None:
            tokens = attach_row(prefixes, identity, self._slots.tables[slot], pool)
        prefix_tokens = tokens or 0
        self._occupy(slot, request_id, DECODE if prefix_tokens else PREFILL)
        self._slots.token_counts[slot] = prefix_tokens
        self._slots.prefix_tokens[slot] = prefix_tokens
        self._pool.bound, self._store.bound = pool, prefixes
        prefixes.bind_pool(pool)
        return Admission(slot, prefix_tokens != 0, prefix_tokens)

    def attach_pages(self, request_id: int, pages: Sequence[int] | npt.NDArray[np.int64], pool: BlockPool) -> None:
        """Share cached full pages holding the request's next tokens into its table and count
        them (the spec's `attach_pages`)."""
        pool = self.check_pool(pool)
        page_size = refusals.require_chunk_page_size(self._page_size)
        slot = self._require_request(request_id)
        row = self._slots.tables[slot]
        mapped = mapped_run(row)
        count = int(self._slots.token_counts[slot])
        if mapped is None or count != mapped * page_size:
            raise refusals.not_page_aligned(int(self._slots.request_ids[slot]), slot, count, page_size)
        append_row_shared(row, pool, pages, mapped)
        tokens = len(pages) * page_size
        self._slots.token_counts[slot] = count + tokens
        self._slots.prefix_tokens[slot] += tokens
        self._pool.bound = pool

    def _share_row(self, source: TableRow, target: TableRow, pool: BlockPool) -> None:
        """The child's table shares every page of the parent's (one more reference each)."""
        fork_row(source, target, pool)

    def fork(self, parent_id: int, child_id: int, pool: BlockPool) -> int:
        """Admit `child_id` sharing every page of `parent_id` (copy-on-write on first write)."""
        pool = self.check_pool(pool)
        parent = self._require_request(parent_id)
        child_id = require_u64("child_id", child_id)
        child = self._require_free_slot(child_id)
        self._share_row(self._slots.tables[parent], self._slots.tables[child], pool)
        copy_slot(self._slots, parent, child)
        self._occupy(child, child_id, int(self._slots.states[parent]))
        self._pool.bound = pool
        return child

    def ensure_writable(self, request_id: int, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        """Make a logical page writable; a `Copy` tells the backend to copy the KV page first."""
        pool = self.check_pool(pool)
        slot = self._require_request(request_id)
        tables = self._slots.tables
        if type(logical_page) is not int or not 0 <= logical_page < tables.shape[1]:
            logical_page = require_logical_page(tables[slot], logical_page)  # or the spec's error
        entry = int(tables[slot, logical_page])
        try:
            action = pool.writable(None if entry == INVALID_BLOCK else entry)
        except Exhausted:
            request_id = int(self._slots.request_ids[slot])
            pages = pool.physical_pages
            raise refusals.no_page_for(
                request_id, slot, logical_page, needed=1, free=pool.free_count(), pages=pages, batch=False
            ) from None
        tables[slot, logical_page] = action.destination if isinstance(action, Copy) else action.page
        self._pool.bound = pool
        return action

    def ensure_writable_batch(
        self,
        request_ids: Sequence[int] | npt.NDArray[np.integer],
        logical_pages: Sequence[int] | npt.NDArray[np.integer],
        pool: BlockPool,
    ) -> ArrayWritePlan:
        """`ensure_writable` for every (request, logical page) pair in order, all or nothing.

        Equivalent to the single calls in sequence (see `kvsched.impl.writes`); on the first
        failing call nothing changes and that call's error is raised.
        """
        pool = self.check_pool(pool)
        plan = ensure_writable_batch(self._slots, self._slot_of, request_ids, logical_pages, pool)
        self._pool.bound = pool
        return plan

    def prepare_decode_round(self, pool: BlockPool, page_size: int) -> ArrayWritePlan:
        """Make every DECODE request's next token page writable, in slot order, all or nothing.

        The request in slot `s` writes its next token at position `token_count`, so its page is
        logical page `token_count // page_size`. One kernel call; the plan's arrays are this
        scheduler's buffers, valid until the next `prepare_decode_round`.
        """
        pool = self.check_pool(pool)
        plan = prepare_decode_round(self._slots, pool, page_size, self._writes)
        self._pool.bound = pool
        return plan

    def mark_prefill_complete(self, request_id: int) -> None:
        """Move a PREFILL request to DECODE."""
        slot = self._require_request(request_id)
        state = int(self._slots.states[slot])
        if not self._completes(state):
            raise refusals.not_prefilling(int(self._slots.request_ids[slot]), slot, REQUEST_STATES[state].value)
        self._slots.states[slot] = DECODE
        self._decoding += 1

    def _completes(self, state: int) -> bool:
        """A request in `state` may complete its prefill."""
        return state == PREFILL

    def seed_decode_token(self, request_id: int, token_id: int) -> None:
        """Publish the token consumed by the request's next decode step."""
        slot = self._require_request(request_id)
        self._slots.next_tokens[slot] = require_u32("token_id", token_id)
        self._slots.token_ready[slot] = True

    def record_token(self, request_id: int) -> int:
        """Count one token written outside a decode round; the new count (saturating)."""
        slot = self._require_request(request_id)
        counts = self._slots.token_counts
        count = int(counts[slot]) + 1
        if count > U32_MAX:
            return U32_MAX
        counts[slot] = count
        return count

    def record_tokens(self, request_id: int, tokens: int) -> int:
        """Count a chunk of `tokens` tokens written outside a decode round; the new count
        (saturating), in O(1): a prefill chunk is one accounting step."""
        slot = self._require_request(request_id)
        tokens = tokens if type(tokens) is int and 0 <= tokens <= U32_MAX else require_u32("tokens", tokens)
        counts = self._slots.token_counts
        count = self._counted(int(counts[slot]), tokens)
        counts[slot] = count
        return count

    def _counted(self, count: int, tokens: int) -> int:
        """A request's token count after `tokens` more (saturating at u32)."""
        return min(count + tokens, U32_MAX)

    def record_chunk(self, request_id: int, tokens: int, pool: BlockPool) -> ArrayWritePlan:
        """A prefill chunk in one call (the spec's `record_chunk`): make room for its positions
        in one kernel call, with no pass over its pages in Python, then count it."""
        pool = self.check_pool(pool)
        page_size = refusals.require_chunk_page_size(self._page_size)
        slot = self._require_request(request_id)
        tokens = tokens if type(tokens) is int and 0 <= tokens <= U32_MAX else require_u32("tokens", tokens)
        counts = self._slots.token_counts
        count = int(counts[slot])
        pages = chunk_steps(count, tokens, page_size, self.logical_pages)
        plan = ensure_writable_range(self._slots, slot, pages, pool)
        counts[slot] = min(count + tokens, U32_MAX)
        self._pool.bound = pool
        return plan

    def page_table(self, request_id: int) -> Table:
        """The request's logical page table (`None` where unmapped)."""
        return to_spec_table(self._slots.tables[self._require_request(request_id)])

    def runnable_into(self, out: MutableSequence[RequestView]) -> int:
        """Write every live request into `out` in slot order; how many were written."""
        live = len(self._slot_of)
        if len(out) < live:
            raise refusals.views_too_small(len(out), live)
        slots = self._slots
        for index, slot in enumerate(sorted(self._slot_of.values())):
            out[index] = RequestView(
                int(slots.request_ids[slot]),
                slot,
                REQUEST_STATES[int(slots.states[slot])],
                int(slots.token_counts[slot]),
                int(slots.prefix_tokens[slot]),
            )
        return live

    def execute_decode_round(
        self,
        backend: ArrayDecodeBackend,
        item_scratch: npt.NDArray[np.void] | None = None,
        block_table_scratch: npt.NDArray[np.uint32] | None = None,
        output_scratch: npt.NDArray[np.void] | None = None,
    ) -> RaggedBatchReceipt:
        """Run one ragged decode round with exactly one backend call (see `kvsched.impl.lowering`).

        Scratch buffers default to the scheduler's own; a caller's must be writable, contiguous
        1-D arrays of `ITEM_DTYPE`, uint32 and `OUTPUT_DTYPE`, sharing no memory with each other
        or with the scheduler's state (`InvalidArgument`, nothing changed).
        """
        items = (
            self._items if item_scratch is None else require_scratch("item_scratch", item_scratch, self._items.dtype)
        )
        tables = (
            self._tables
            if block_table_scratch is None
            else require_scratch("block_table_scratch", block_table_scratch, self._tables.dtype)
        )
        outputs = (
            self._outputs
            if output_scratch is None
            else require_scratch("output_scratch", output_scratch, self._outputs.dtype)
        )
        given = (item_scratch, block_table_scratch, output_scratch)
        if item_scratch is not None or block_table_scratch is not None or output_scratch is not None:
            buffers = {"item_scratch": items, "block_table_scratch": tables, "output_scratch": outputs}
            supplied = tuple(name for name, buffer in zip(buffers, given, strict=True) if buffer is not None)
            self._require_disjoint(buffers, supplied)
        refs = None if self._pool.bound is None else get_arrays(self._pool.bound).refs
        rounds = (self._decoding, self._round_slots, refs, self._page_size or 0)
        return execute_round(self._slots, *rounds, backend, items, tables, outputs)

    def finish(self, request_id: int, pool: BlockPool) -> None:
        """Release the request's pages and empty its slot; cancellation is identical."""
        pool = self.check_pool(pool)
        slot = self._require_request(request_id)
        key = int(self._slots.request_ids[slot])  # the plain int the id denotes (a numpy id is not a key)
        self._release_row(self._slots.tables[slot], pool)
        self._decoding -= int(self._slots.states[slot]) == DECODE
        self._clear_slot(slot)
        self._forget_id(key)
        heapq.heappush(self._empty, slot)
        self._pool.bound = pool

    def _release_row(self, row: TableRow, pool: BlockPool) -> None:
        """Release a finished request's pages, all or nothing, and clear its table."""
        release_row(row, pool)

    def _clear_slot(self, slot: int) -> None:
        """Reset a finished request's slot (its table apart)."""
        clear_slot(self._slots, slot)

    def _forget_id(self, request_id: int) -> None:
        """A finished request's id finds no slot any more."""
        del self._slot_of[request_id]

    def _require_disjoint(self, buffers: dict[str, Any], supplied: tuple[str, ...]) -> None:
        """A round's scratch buffers share no memory with each other or the scheduler's arrays."""
        require_disjoint(buffers, supplied, (*self._slots, self._round_slots, *self._writes))

    def __repr__(self) -> str:
        live = len(self._slot_of)
        return f"RequestScheduler(requests={self.requests}, logical_pages={self.logical_pages}, live={live})"


def get_indexes(scheduler: RequestScheduler) -> tuple[dict[int, int], list[int], int]:
    """The scheduler's indexes (slot_of, empty heap, decoding count), for the refinement checks."""
    return scheduler._slot_of, scheduler._empty, scheduler._decoding


def lower_decode_round(scheduler: RequestScheduler) -> int:
    """`execute_decode_round`'s first half, for an engine that plans its round before its other
    changes: the round lowered into the scheduler's own buffers, how many requests it runs."""
    refs = None if scheduler._pool.bound is None else get_arrays(scheduler._pool.bound).refs
    buffers = scheduler._items, scheduler._tables, scheduler._outputs
    rounds = (scheduler._slots, scheduler._decoding, scheduler._round_slots, refs, scheduler._page_size or 0)
    return lower_decode(*rounds, *buffers)


def run_decode_round(scheduler: RequestScheduler, backend: ArrayDecodeBackend, count: int) -> RaggedBatchReceipt:
    """`execute_decode_round`'s second half: the round `lower_decode_round` lowered (`count`
    requests) run with one backend call, its answers applied."""
    buffers = scheduler._items, scheduler._tables, scheduler._outputs
    return run_lowered(scheduler._slots, count, scheduler._round_slots, backend, *buffers)


def unapply_decode_round(scheduler: RequestScheduler, count: int) -> None:
    """Take back what `run_decode_round` applied to the `count` slots of the round it ran: each
    slot's input token and count as its lowered item names them (the token stays ready: the
    round needed it so)."""
    items, slots = scheduler._items[:count], scheduler._round_slots[:count]
    scheduler._slots.next_tokens[slots] = items["token_id"]
    scheduler._slots.token_counts[slots] = items["position"]


def get_slots(scheduler: RequestScheduler) -> SlotArrays:
    """The scheduler's slot arrays, for the refinement checks."""
    return scheduler._slots


def round_outputs(scheduler: RequestScheduler, count: int) -> npt.NDArray[np.void]:
    """The outputs of the scheduler's latest round run in its own buffers (its first `count`)."""
    return scheduler._outputs[:count]


# -- the engine's admissions, one step's at a time ----------------------------------------------


class Newcomer(NamedTuple):
    """One admission the engine has checked: the slot `claim_slot` gave it, the named prefix it
    attaches (or None), the cached pages after it, the logical pages its first chunk writes, and
    the tokens that chunk counts (0 for a full hit, whose named prefix already counts them)."""

    slot: int
    identity: PrefixIdentity | None
    hit: list[int]
    pages: range
    tokens: int


def claim_slot(scheduler: RequestScheduler, request_id: int) -> int:
    """Occupy the lowest empty slot with `request_id` in PREFILL (the engine has checked that one
    is empty and the id is not live); `seat_newcomers` attaches its pages."""
    slot = scheduler._empty[0]
    scheduler._occupy(slot, request_id, PREFILL)
    return slot


def seat_newcomers(
    scheduler: RequestScheduler, newcomers: Sequence[Newcomer], store: PrefixKvStore, pool: BlockPool
) -> ArrayWritePlan:
    """What `admit_with_prefix`, `attach_pages` and `record_chunk` (for a full hit,
    `ensure_writable_batch` of the chunk's pages) do after the slot, for every newcomer in order,
    with one kernel call for all their chunks: the same state, for inputs the engine has checked
    (hits page-aligned after the named prefix, and free pages enough for every chunk). Attaching
    never takes a free page, so running every chunk after every attach allocates the same pages."""
    slots = scheduler._slots
    tables, page_size = slots.tables, scheduler._page_size or 0
    hits: list[npt.NDArray[np.int64]] = []
    step_slots: list[int] = []
    step_pages: list[int] = []
    for slot, identity, hit, pages, tokens in newcomers:
        row = tables[slot]
        named = 0 if identity is None else attach_row(store, identity, row, pool) or 0
        if named:
            slots.states[slot] = DECODE
            scheduler._decoding += 1
        if hit:
            start = -(-named // page_size)
            hits.append(np.asarray(hit, dtype=np.int64))
            row[start : start + len(hit)] = hits[-1]
        attached = named + len(hit) * page_size
        slots.prefix_tokens[slot] = attached
        slots.token_counts[slot] = min(attached + tokens, U32_MAX)
        step_slots += [slot] * len(pages)
        step_pages += pages
    if hits:
        retain_array(pool, np.concatenate(hits))
    count = len(step_slots)
    buffers = new_write_buffers(count)
    buffers.slots[:count] = step_slots
    buffers.logical_pages[:count] = step_pages
    return run_steps(slots, pool, buffers, count, step_pages, None)


def undo_writes(scheduler: RequestScheduler, plan: ArrayWritePlan, pool: BlockPool) -> None:
    """Take back `plan` (a `prepare_decode_round`'s or a `record_chunk`'s over `pool`), when
    nothing has changed since but later plans already taken back: each page it took goes back to
    its place on the free stack, each table entry to what it was, each copy's source regains its
    reference (`undo_rows`, newest first). A chunk's count is the caller's to put back."""
    refs, _, top, _ = get_arrays(pool)
    tables = scheduler._slots.tables
    undo_rows(tables, plan.slots, plan.logical_pages, len(plan), refs, top, plan.kinds, plan.pages, plan.sources)


def unseat_newcomers(scheduler: RequestScheduler, slots: list[int], plan: ArrayWritePlan, pool: BlockPool) -> None:
    """Take back `claim_slot` and `seat_newcomers` of the newcomers in `slots` (whose chunks
    took `plan`), when nothing has changed since but later changes already taken back: the
    chunks' pages back in place on the free stack (`undo_writes`), then the pages the newcomers
    attached let go (the store or the cache holds each too, so none is freed) and their slots
    empty (`finish_slots`)."""
    undo_writes(scheduler, plan, pool)
    finish_slots(scheduler, slots, pool)


def finish_slots(scheduler: RequestScheduler, slots: list[int], pool: BlockPool) -> None:
    """`finish` of the live request in each of `slots`, in order, with one kernel call for all
    their pages (released row by row, in logical order, as `finish` releases them)."""
    arrays = scheduler._slots
    release_array(pool, arrays.tables[slots].ravel(), skip_invalid=True)
    arrays.tables[slots] = INVALID_BLOCK
    scheduler._decoding -= int(np.count_nonzero(arrays.states[slots] == DECODE))
    for request_id in arrays.request_ids[slots].tolist():
        del scheduler._slot_of[request_id]
    for slot in slots:
        heapq.heappush(scheduler._empty, slot)
    clear_slot(arrays, slots)
