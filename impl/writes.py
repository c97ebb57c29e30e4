"""Batched copy-on-write: make room for many writes with one kernel call, all or nothing.

The reference semantics is a sequence of the spec's single-request calls, applied in order,
undone entirely if any of them fails (the error raised is the first failing call's):

    prepare_decode_round(pool, page_size)
        == for each DECODE slot s, in slot order:
               ensure_writable(request_id(s), token_count(s) // page_size, pool)
    ensure_writable_batch(request_ids, logical_pages, pool)
        == for i in range(n): ensure_writable(request_ids[i], logical_pages[i], pool)

Steps see the effects of earlier steps: after one request copies a shared page, a later
request still holding it may find it exclusive (`EXISTING`). The result is a `WritePlan`:
per step the action kind, the page now mapped and a copy's source, plus the copies compacted
into (source, destination) arrays a batched page-copy kernel takes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kvsched.impl import faults
from kvsched.impl.jit import jit
from kvsched.impl.page_kernels import ALLOCATED, COPY, EXISTING, collect_copies, ensure_rows, undo_rows
from kvsched.impl.pool import BlockPool, get_arrays
from kvsched.impl.slots import DECODE, SlotArrays
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.domain import require_int, require_u64
from kvsched.spec.errors import InvalidArgument, KvschedError
from kvsched.spec.plan import WritePlan, pages_needed
from kvsched.spec.pool import Allocated, Copy, CopyOnWrite, Existing
from kvsched.spec.slots import require_page_size

__all__ = ["ALLOCATED", "COPY", "EXISTING", "ArrayWritePlan", "WriteBuffers", "WritePlan", "new_write_buffers"]


class WriteBuffers(NamedTuple):
    """Storage for one batched call's steps (the scheduler keeps one set, `requests` long)."""

    slots: npt.NDArray[np.int64]
    logical_pages: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.uint8]
    pages: npt.NDArray[np.uint32]
    sources: npt.NDArray[np.uint32]
    copy_sources: npt.NDArray[np.uint32]
    copy_destinations: npt.NDArray[np.uint32]


def new_write_buffers(capacity: int) -> WriteBuffers:
    """Buffers for up to `capacity` steps."""
    return WriteBuffers(
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=np.uint8),
        np.zeros(capacity, dtype=np.uint32),
        np.zeros(capacity, dtype=np.uint32),
        np.zeros(capacity, dtype=np.uint32),
        np.zeros(capacity, dtype=np.uint32),
    )


class ArrayWritePlan(WritePlan):
    """The spec's `WritePlan`, its steps kept in arrays, in step order.

    The arrays are views of the buffers they were computed in: a plan from
    `prepare_decode_round` is valid until the scheduler's next `prepare_decode_round`.
    """

    __slots__ = ("copy_destinations", "copy_sources", "kinds", "logical_pages", "pages", "slots", "sources")

    def __init__(self, buffers: WriteBuffers, count: int, copies: int) -> None:
        self.slots = buffers.slots[:count]  # [steps] the request slot written
        self.logical_pages = buffers.logical_pages[:count]  # [steps] its logical page
        self.kinds = buffers.kinds[:count]  # [steps] EXISTING, ALLOCATED or COPY
        self.pages = buffers.pages[:count]  # [steps] the physical page the write goes to
        self.sources = buffers.sources[:count]  # [steps] a COPY's source page, INVALID_BLOCK otherwise
        self.copy_sources = buffers.copy_sources[:copies]  # [copies] copy these pages ...
        self.copy_destinations = buffers.copy_destinations[:copies]  # [copies] ... into these, first

    def __len__(self) -> int:
        return int(self.kinds.shape[0])

    def targets(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.slots.tolist(), self.logical_pages.tolist(), strict=True))

    def actions(self) -> tuple[CopyOnWrite, ...]:
        actions: list[CopyOnWrite] = []
        for kind, page, source in zip(self.kinds.tolist(), self.pages.tolist(), self.sources.tolist(), strict=True):
            if kind == EXISTING:
                actions.append(Existing(page))
            elif kind == ALLOCATED:
                actions.append(Allocated(page))
            else:
                actions.append(Copy(source, page))
        return tuple(actions)


def _exhausted(slots: SlotArrays, pool: BlockPool, buffers: WriteBuffers, count: int, at: int) -> KvschedError:
    """The spec's refusal of a batch whose step `at` found no free page: the new pages its
    valid steps (those before the first logical page outside the table) need."""
    width = slots.tables.shape[1]
    refs = get_arrays(pool).refs
    steps: list[tuple[tuple[int, int], int | None]] = []
    for slot, logical in zip(buffers.slots[:count].tolist(), buffers.logical_pages[:count].tolist(), strict=True):
        if not 0 <= logical < width:
            break
        entry = int(slots.tables[slot, logical])
        steps.append(((slot, logical), None if entry == INVALID_BLOCK else entry))
    slot, logical = int(buffers.slots[at]), int(buffers.logical_pages[at])
    return refusals.no_page_for(
        int(slots.request_ids[slot]),
        slot,
        logical,
        needed=pages_needed(steps, lambda page: int(refs[page])),
        free=pool.free_count(),
        pages=pool.physical_pages,
        batch=True,
    )


@jit
def prepare_round(
    states: Any,
    token_counts: Any,
    tables: Any,
    page_size: int,
    refs: Any,
    free: Any,
    top: Any,
    slots: Any,
    logical_pages: Any,
    kinds: Any,
    pages: Any,
    sources: Any,
    copy_sources: Any,
    copy_destinations: Any,
) -> tuple[int, int, int, int, int]:
    """Select the DECODE slots and make each one's next token page writable:
    (code, step, detail, steps, copies), no copies on a failure. The buffers are `WriteBuffers`'
    fields, passed one by one: numba types a tuple of arrays on every call, which costs more than
    the round."""
    count = 0
    for slot in range(states.shape[0]):
        if states[slot] == DECODE:
            slots[count] = slot
            logical_pages[count] = token_counts[slot] // page_size
            count += 1
    code, at, detail = ensure_rows(tables, slots, logical_pages, count, refs, free, top, kinds, pages, sources)
    if code != faults.OK:
        return code, at, detail, count, 0  # count: the steps, for the refusal's figures
    copies = collect_copies(kinds, pages, sources, count, copy_sources, copy_destinations)
    return code, at, detail, count, copies


def prepare_decode_round(
    slots: SlotArrays, pool: BlockPool, page_size: object, buffers: WriteBuffers
) -> ArrayWritePlan:
    """Make every DECODE request's next token page (`token_count // page_size`) writable."""
    page_size = require_page_size(page_size)
    refs, free, top, _ = get_arrays(pool)
    code, at, detail, count, copies = prepare_round(
        slots.states, slots.token_counts, slots.tables, page_size, refs, free, top, *buffers
    )
    if code == faults.EXHAUSTED:
        raise _exhausted(slots, pool, buffers, count, at)
    if code != faults.OK:
        raise faults.get_error(code, detail, physical_pages=pool.physical_pages, logical_pages=slots.tables.shape[1])
    return ArrayWritePlan(buffers, count, copies)


def _as_list(values: Sequence[object] | npt.NDArray[np.integer]) -> list[object]:
    if isinstance(values, np.ndarray):
        converted: list[object] = values.tolist()
        return converted
    return list(values)


def ensure_writable_batch(
    slots: SlotArrays,
    slot_of: dict[int, int],
    request_ids: Sequence[int] | npt.NDArray[np.integer],
    logical_pages: Sequence[int] | npt.NDArray[np.integer],
    pool: BlockPool,
) -> ArrayWritePlan:
    """`ensure_writable(request_ids[i], logical_pages[i])` for every i, in order, all or nothing.

    Integer numpy arrays are taken as their Python values. The plan's arrays are new (O(n)).
    """
    ids, targets = _as_list(request_ids), _as_list(logical_pages)
    if len(ids) != len(targets):
        raise InvalidArgument(f"{len(ids)} request ids but {len(targets)} logical pages")
    width = slots.tables.shape[1]
    buffers = new_write_buffers(len(ids))
    failure: KvschedError | None = None
    step_slots: list[int] = []
    step_pages: list[int] = []
    for request_id, logical_page in zip(ids, targets, strict=True):
        # Only valid u64 ids are keys, so a plain int's hit needs no domain check; anything else
        # (another integer, a miss, a bad value) takes the spec's checks and errors.
        slot = slot_of.get(request_id) if type(request_id) is int else None
        logical = logical_page if type(logical_page) is int else None
        if slot is None or logical is None:
            try:
                number = require_u64("request_id", request_id)
                slot = slot_of.get(number)
                if slot is None:
                    raise refusals.unknown_request(number)
                logical = require_int("logical page", logical_page)
            except KvschedError as error:
                failure = error
                break
        step_slots.append(slot)
        step_pages.append(logical if 0 <= logical < width else -1)
    count = len(step_slots)
    buffers.slots[:count] = step_slots
    buffers.logical_pages[:count] = step_pages
    return run_steps(slots, pool, buffers, count, targets, failure)


def ensure_writable_range(slots: SlotArrays, slot: int, pages: range, pool: BlockPool) -> ArrayWritePlan:
    """`ensure_writable_batch` of the live request in `slot` over the consecutive logical
    `pages` (a prefill chunk's), with no pass over the steps in Python."""
    width = slots.tables.shape[1]
    count = min(len(pages), max(width - pages.start, 0) + 1)  # the steps up to the first outside the table
    buffers = new_write_buffers(count)
    buffers.slots[:count] = slot
    buffers.logical_pages[:count] = np.arange(pages.start, pages.start + count, dtype=np.int64)
    if count and pages.start + count > width:
        buffers.logical_pages[count - 1] = -1  # only the last step can be outside the table
    return run_steps(slots, pool, buffers, count, pages, None)


def run_steps(
    slots: SlotArrays,
    pool: BlockPool,
    buffers: WriteBuffers,
    count: int,
    targets: Sequence[object],
    failure: KvschedError | None,
) -> ArrayWritePlan:
    """Run the `count` steps in `buffers` in one kernel call, all or nothing; raise the first
    failing step's error (a kernel refusal before `failure`, the pass's own, found after them)."""
    width = slots.tables.shape[1]
    refs, free, top, _ = get_arrays(pool)
    code, at, detail = ensure_rows(
        slots.tables, buffers.slots, buffers.logical_pages, count, refs, free, top, *buffers[2:5]
    )
    if code == faults.OUT_OF_TABLE:
        detail = require_int("logical page", targets[at])  # the input, which may not fit int64
    if code == faults.EXHAUSTED:
        raise _exhausted(slots, pool, buffers, count, at)
    if code != faults.OK:
        raise faults.get_error(code, detail, physical_pages=pool.physical_pages, logical_pages=width)
    if failure is not None:
        undo_rows(slots.tables, buffers.slots, buffers.logical_pages, count, refs, top, *buffers[2:5])
        raise failure
    copies = collect_copies(buffers.kinds, buffers.pages, buffers.sources, count, *buffers[5:])
    return ArrayWritePlan(buffers, count, copies)
