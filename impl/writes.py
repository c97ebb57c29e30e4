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
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kvsched.impl import faults
from kvsched.impl.jit import jit
from kvsched.impl.page_kernels import ALLOCATED, COPY, EXISTING, collect_copies, ensure_rows, undo_rows
from kvsched.impl.pool import BlockPool, get_arrays
from kvsched.impl.slots import DECODE, SlotArrays
from kvsched.spec.domain import require_u64
from kvsched.spec.errors import InvalidArgument, KvschedError, UnknownRequest
from kvsched.spec.pool import Allocated, Copy, CopyOnWrite, Existing
from kvsched.spec.scheduler import require_page_size

__all__ = ["ALLOCATED", "COPY", "EXISTING", "WriteBuffers", "WritePlan", "new_write_buffers"]


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


@dataclass(frozen=True, slots=True, eq=False)
class WritePlan:
    """What a batched ensure_writable did, one entry per step, in step order.

    The arrays are views of the buffers they were computed in: a plan from
    `prepare_decode_round` is valid until the scheduler's next `prepare_decode_round`.
    """

    slots: npt.NDArray[np.int64]  # [steps] the request slot written
    logical_pages: npt.NDArray[np.int64]  # [steps] its logical page
    kinds: npt.NDArray[np.uint8]  # [steps] EXISTING, ALLOCATED or COPY
    pages: npt.NDArray[np.uint32]  # [steps] the physical page the write goes to
    sources: npt.NDArray[np.uint32]  # [steps] a COPY's source page, INVALID_BLOCK otherwise
    copy_sources: npt.NDArray[np.uint32]  # [copies] copy these pages ...
    copy_destinations: npt.NDArray[np.uint32]  # [copies] ... into these, before writing

    def __len__(self) -> int:
        return int(self.kinds.shape[0])

    def actions(self) -> tuple[CopyOnWrite, ...]:
        """Each step as the spec's `CopyOnWrite` value (what the single calls would return)."""
        actions: list[CopyOnWrite] = []
        for kind, page, source in zip(self.kinds.tolist(), self.pages.tolist(), self.sources.tolist(), strict=True):
            if kind == EXISTING:
                actions.append(Existing(page))
            elif kind == ALLOCATED:
                actions.append(Allocated(page))
            else:
                actions.append(Copy(source, page))
        return tuple(actions)


def _plan(buffers: WriteBuffers, count: int, copies: int) -> WritePlan:
    return WritePlan(
        buffers.slots[:count],
        buffers.logical_pages[:count],
        buffers.kinds[:count],
        buffers.pages[:count],
        buffers.sources[:count],
        buffers.copy_sources[:copies],
        buffers.copy_destinations[:copies],
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
    (code, step, detail, steps, copies). The buffers are `WriteBuffers`' fields, passed one by
    one: numba types a tuple of arrays on every call, which costs more than the round."""
    count = 0
    for slot in range(states.shape[0]):
        if states[slot] == DECODE:
            slots[count] = slot
            logical_pages[count] = token_counts[slot] // page_size
            count += 1
    code, at, detail = ensure_rows(tables, slots, logical_pages, count, refs, free, top, kinds, pages, sources)
    if code != faults.OK:
        return code, at, detail, 0, 0
    copies = collect_copies(kinds, pages, sources, count, copy_sources, copy_destinations)
    return code, at, detail, count, copies


def prepare_decode_round(slots: SlotArrays, pool: BlockPool, page_size: object, buffers: WriteBuffers) -> WritePlan:
    """Make every DECODE request's next token page (`token_count // page_size`) writable."""
    page_size = require_page_size(page_size)
    refs, free, top, _ = get_arrays(pool)
    code, _, detail, count, copies = prepare_round(
        slots.states, slots.token_counts, slots.tables, page_size, refs, free, top, *buffers
    )
    if code != faults.OK:
        raise faults.get_error(code, detail, physical_pages=pool.physical_pages, logical_pages=slots.tables.shape[1])
    return _plan(buffers, count, copies)


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
) -> WritePlan:
    """`ensure_writable(request_ids[i], logical_pages[i])` for every i, in order, all or nothing.

    Integer numpy arrays are taken as their Python values. The plan's arrays are new (O(n)).
    """
    ids, targets = _as_list(request_ids), _as_list(logical_pages)
    if len(ids) != len(targets):
        raise InvalidArgument(f"{len(ids)} request ids but {len(targets)} logical pages")
    width = slots.tables.shape[1]
    buffers = new_write_buffers(len(ids))
    failure: KvschedError | None = None
    count = 0
    for request_id, logical_page in zip(ids, targets, strict=True):
        try:
            slot = slot_of.get(require_u64("request_id", request_id))
        except KvschedError as error:
            failure = error
            break
        if slot is None:
            failure = UnknownRequest(f"request {request_id} is not live")
            break
        if not isinstance(logical_page, int) or isinstance(logical_page, bool):
            failure = InvalidArgument(f"logical page must be an int, got {type(logical_page).__name__}")
            break
        buffers.slots[count] = slot
        buffers.logical_pages[count] = logical_page if 0 <= logical_page < width else -1
        count += 1
    refs, free, top, _ = get_arrays(pool)
    code, at, detail = ensure_rows(
        slots.tables, buffers.slots, buffers.logical_pages, count, refs, free, top, *buffers[2:5]
    )
    if code == faults.OUT_OF_TABLE:
        detail = targets[at]  # type: ignore[assignment]  # the input, which may not fit int64
    if code != faults.OK:
        raise faults.get_error(code, detail, physical_pages=pool.physical_pages, logical_pages=width)
    if failure is not None:
        undo_rows(slots.tables, buffers.slots, buffers.logical_pages, count, refs, top, *buffers[2:5])
        raise failure
    copies = collect_copies(buffers.kinds, buffers.pages, buffers.sources, count, *buffers[5:])
    return _plan(buffers, count, copies)
