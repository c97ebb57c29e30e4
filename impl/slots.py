"""The scheduler's request slots as struct-of-arrays, and their abstraction to spec slots.

Slot `s` is one row of every array below; its page table is row `s` of `tables`. Ownership:
only `kvsched.impl.scheduler` and the round kernels it calls (`lowering`, `writes`) write them.

    request_ids   uint64[requests]   the live request's id (0 when empty)
    states        uint8[requests]    EMPTY / PREFILL / DECODE
    token_counts  uint32[requests]   tokens whose KV is written (saturating at 2**32 - 1)
    prefix_tokens uint32[requests]   tokens that came from an attached prefix
    next_tokens   uint32[requests]   the input token of the next decode step
    token_ready   bool[requests]     next_tokens holds a seeded or generated token
    tables        uint32[requests, logical_pages]   INVALID_BLOCK where unmapped
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from kvsched.impl.table import to_spec_table
from kvsched.spec.batch import INVALID_BLOCK
from kvsched.spec.slots import RequestState, SchedulerState, Slot

EMPTY: Final = 0
PREFILL: Final = 1
DECODE: Final = 2
STATE_CODES: Final = {RequestState.EMPTY: EMPTY, RequestState.PREFILL: PREFILL, RequestState.DECODE: DECODE}
REQUEST_STATES: Final = {code: state for state, code in STATE_CODES.items()}


class SlotArrays(NamedTuple):
    """Every slot field, one array each (the scheduler's whole storage but its indexes)."""

    request_ids: npt.NDArray[np.uint64]
    states: npt.NDArray[np.uint8]
    token_counts: npt.NDArray[np.uint32]
    prefix_tokens: npt.NDArray[np.uint32]
    next_tokens: npt.NDArray[np.uint32]
    token_ready: npt.NDArray[np.bool_]
    tables: npt.NDArray[np.uint32]


def new_slot_arrays(requests: int, logical_pages: int) -> SlotArrays:
    """`requests` empty slots with unmapped tables of `logical_pages` entries."""
    return SlotArrays(
        np.zeros(requests, dtype=np.uint64),
        np.zeros(requests, dtype=np.uint8),
        np.zeros(requests, dtype=np.uint32),
        np.zeros(requests, dtype=np.uint32),
        np.zeros(requests, dtype=np.uint32),
        np.zeros(requests, dtype=np.bool_),
        np.full((requests, logical_pages), INVALID_BLOCK, dtype=np.uint32),
    )


def clear_slot(slots: SlotArrays, slot: int | list[int]) -> None:
    """Reset every field of a slot (or a list of them) but the table (which `release_row` clears)."""
    slots.request_ids[slot] = 0
    slots.states[slot] = EMPTY
    slots.token_counts[slot] = 0
    slots.prefix_tokens[slot] = 0
    slots.next_tokens[slot] = 0
    slots.token_ready[slot] = False


def copy_slot(slots: SlotArrays, source: int, target: int) -> None:
    """Copy every field but the table from slot `source` to slot `target`."""
    for array in slots[:-1]:
        array[target] = array[source]


def to_spec_slots(slots: SlotArrays) -> SchedulerState:
    """The abstraction function for the scheduler's slots."""
    columns = zip(
        slots.request_ids.tolist(),
        slots.states.tolist(),
        slots.token_counts.tolist(),
        slots.prefix_tokens.tolist(),
        slots.next_tokens.tolist(),
        slots.token_ready.tolist(),
        strict=True,
    )
    return SchedulerState(
        tuple(
            Slot(to_spec_table(slots.tables[index]), rid, REQUEST_STATES[state], count, prefix, token, ready)
            for index, (rid, state, count, prefix, token, ready) in enumerate(columns)
        )
    )
