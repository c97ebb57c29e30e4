"""Request slots as values: what a slot holds, the scheduler's state, and the predicates over it.

    EMPTY --admit (prefix miss)--> PREFILL --mark_prefill_complete--> DECODE --round--> DECODE
    EMPTY --admit (prefix hit)---------------------------------------> DECODE
    EMPTY --fork(parent)--> the parent's state           any live --finish--> EMPTY

The transitions are `kvsched.spec.lifecycle` (admission to finish) and `kvsched.spec.round`
(the decode round); `kvsched.spec.scheduler` is the object API over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvsched.spec import table as table_ops
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import as_int, require_size
from kvsched.spec.errors import InvalidArgument
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

    table: Table  # its logical page table, fixed capacity (None where a logical page is unmapped)
    request_id: int = 0  # the live request's id (0 when empty)
    state: RequestState = RequestState.EMPTY
    token_count: int = 0  # tokens whose KV is written: the next one goes at this position
    prefix_tokens: int = 0  # of them, how many came with an attached prefix
    next_token_id: int = 0  # the token the next decode step consumes ...
    token_ready: bool = False  # ... once seeded (or produced by a round)


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
    return SchedulerState(slots=(Slot(table=table_ops.empty_table(logical_pages)),) * requests)


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


def can_admit(state: SchedulerState, request_id: int) -> bool:
    """`request_id` is not live and a slot is empty."""
    return find_request(state, request_id) is None and find_empty_slot(state) is not None


def with_slot(state: SchedulerState, index: int, slot: Slot) -> SchedulerState:
    """`state` with slot `index` replaced."""
    return SchedulerState(state.slots[:index] + (slot,) + state.slots[index + 1 :])


def get_views(state: SchedulerState) -> tuple[RequestView, ...]:
    """Every live request, in slot order."""
    return tuple(
        RequestView(
            request_id=slot.request_id,
            slot=index,
            state=slot.state,
            token_count=slot.token_count,
            prefix_tokens=slot.prefix_tokens,
        )
        for index, slot in enumerate(state.slots)
        if is_live(slot)
    )


def get_decoding_slots(state: SchedulerState) -> tuple[int, ...]:
    """The indices of DECODE slots, in slot order: the order of a round's items."""
    return tuple(index for index, slot in enumerate(state.slots) if slot.state is RequestState.DECODE)


def require_page_size(page_size: object) -> int:
    """`page_size` as an int in 1..2**32-1, else `InvalidArgument`."""
    size = as_int(page_size)
    if size is None or not 1 <= size <= U32_MAX:
        raise InvalidArgument(f"page_size must be an integer in 1..2**32-1, not {page_size!r}")
    return size
