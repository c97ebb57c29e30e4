"""One ragged decode round: lower every DECODE slot into ABI records, call the backend once,
check the whole answer, then commit.

    items[i]        = (request_id, slot, token_id, position = token_count,
                       block_table_offset = i * logical_pages, logical_pages, 0)
    block_tables    = [ table(slot_0) | table(slot_1) | ... ]   logical_pages u32 entries each
    outputs[i]      UNANSWERED (slot 2**32 - 1) before the call, written by the backend

Before anything is written, every decoding request's write target (the page holding position
`token_count`) must be mapped and held by it alone (with no page size bound: every page of its
table), so the backend never writes a page another owner reads.

The backend receives views of the scratch arrays (`items[:n]` and `block_tables[:n * width]`
read-only, `outputs[:n]` writable), so a batch reaches a GPU without conversion. The checks
and their order are the spec's (`RequestScheduler.execute_decode_round`); the slots change only
after every check passed, in one kernel call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.abi import ItemArray, OutputArray, TableArray
from kvsched.impl.jit import jit
from kvsched.impl.slots import DECODE, SlotArrays
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK, U32_MAX, RaggedBatchReceipt
from kvsched.spec.errors import (
    InvalidArgument,
)

MISSING_TOKEN = 0  # lower_round's codes: a DECODE slot with no seeded token
UNWRITABLE = 1  # a DECODE slot whose write target is unmapped or shared
NO_PAGE = -1


@jit
def lower_round(
    states: Any,
    request_ids: Any,
    next_tokens: Any,
    token_counts: Any,
    token_ready: Any,
    tables: Any,
    refs: Any,  # [pages] uint32, the bound pool's reference counts
    page_size: int,  # 0: none bound
    items: Any,
    block_tables: Any,
    outputs: Any,
    round_slots: Any,
) -> tuple[int, int, int, int]:
    """Lower the DECODE slots in slot order: (-1, count, 0, 0); or, having written nothing,
    (MISSING_TOKEN, the first slot with no input token, 0, 0), else (UNWRITABLE, the first slot
    whose write target is unmapped or shared, its page or NO_PAGE, the page's count). Sets
    `outputs[:count]` to the spec's `UNANSWERED` (request 0, slot 2**32 - 1, token 0); records
    the slots in `round_slots`."""
    width = tables.shape[1]
    count = 0
    for slot in range(states.shape[0]):
        if states[slot] == DECODE:
            if not token_ready[slot]:
                return MISSING_TOKEN, slot, 0, 0
            round_slots[count] = slot
            count += 1
    for index in range(count):
        slot = round_slots[index]
        if page_size == 0:
            for entry in range(width):
                page = tables[slot, entry]
                if page != INVALID_BLOCK and refs[page] != 1:
                    return UNWRITABLE, slot, int(page), int(refs[page])
            continue
        logical = token_counts[slot] // page_size
        if logical >= width or tables[slot, logical] == INVALID_BLOCK:
            return UNWRITABLE, slot, NO_PAGE, 0
        page = tables[slot, logical]
        if refs[page] != 1:
            return UNWRITABLE, slot, int(page), int(refs[page])
    for index in range(count):
        slot = round_slots[index]
        item = items[index]
        item["request_id"] = request_ids[slot]
        item["slot"] = slot
        item["token_id"] = next_tokens[slot]
        item["position"] = token_counts[slot]
        item["block_table_offset"] = index * width
        item["logical_pages"] = width
        item["reserved"] = 0
        offset = index * width
        for entry in range(width):
            block_tables[offset + entry] = tables[slot, entry]
        output = outputs[index]
        output["request_id"] = 0
        output["slot"] = U32_MAX  # no scheduler has this slot: an unwritten output never matches
        output["next_token_id"] = 0
    return -1, count, 0, 0


@jit
def apply_round(
    outputs: Any,
    round_slots: Any,
    count: int,
    request_ids: Any,
    next_tokens: Any,
    token_counts: Any,
    token_ready: Any,
) -> int:
    """Commit a round if every output answers its item: -1, or the first mismatching position
    (and nothing changed)."""
    for index in range(count):
        slot = round_slots[index]
        output = outputs[index]
        if output["request_id"] != request_ids[slot] or output["slot"] != slot:
            return index
    for index in range(count):
        slot = round_slots[index]
        next_tokens[slot] = outputs[index]["next_token_id"]
        if token_counts[slot] < U32_MAX:
            token_counts[slot] += 1
        token_ready[slot] = True
    return -1


def require_scratch(name: str, value: object, dtype: np.dtype[Any]) -> Any:
    """A caller's scratch buffer: a writable, C-contiguous 1-D array of `dtype`."""
    if not (
        isinstance(value, np.ndarray)
        and value.ndim == 1
        and value.dtype == dtype
        and value.flags.c_contiguous
        and value.flags.writeable
    ):
        raise InvalidArgument(f"{name} must be a writable contiguous 1-D array of {dtype}")
    return value


def require_disjoint(buffers: dict[str, Any], supplied: tuple[str, ...], own: tuple[Any, ...]) -> None:
    """Refuse caller's buffers (`supplied`) that share memory with another round buffer or with
    the scheduler's own state: the backend would read a table the outputs overwrite, or the
    round would write the slots. Every buffer is contiguous, so overlapping bounds are shared
    memory (`np.may_share_memory`, O(1)); the scheduler's own buffers never overlap."""
    for name in supplied:
        buffer = buffers[name]
        for other, other_buffer in buffers.items():
            if other != name and np.may_share_memory(buffer, other_buffer):
                first, second = sorted((name, other), key=list(buffers).index)
                raise InvalidArgument(f"{first} and {second} share memory: each round buffer needs its own")
        if any(np.may_share_memory(buffer, array) for array in own):
            raise InvalidArgument(f"{name} shares memory with the scheduler's own state")


def _read_only(view: Any) -> Any:
    view.flags.writeable = False
    return view


def execute_round(
    slots: SlotArrays,
    decoding: int,
    round_slots: npt.NDArray[np.int64],
    refs: npt.NDArray[np.uint32] | None,
    page_size: int,
    backend: Any,
    items: ItemArray,
    block_tables: TableArray,
    outputs: OutputArray,
) -> RaggedBatchReceipt:
    """Run one round over the slots (`decoding` of them in DECODE) with the given scratch, the
    bound pool's reference counts (None: no pool bound, so no request was ever admitted) and
    page size (0: none bound): `lower_decode`, then `run_lowered`."""
    count = lower_decode(slots, decoding, round_slots, refs, page_size, items, block_tables, outputs)
    return run_lowered(slots, count, round_slots, backend, items, block_tables, outputs)


def lower_decode(
    slots: SlotArrays,
    decoding: int,
    round_slots: npt.NDArray[np.int64],
    refs: npt.NDArray[np.uint32] | None,
    page_size: int,
    items: ItemArray,
    block_tables: TableArray,
    outputs: OutputArray,
) -> int:
    """Lower the round over the slots (`decoding` of them in DECODE) into the scratch, each
    request's slot into `round_slots`: how many it runs. The slots are not changed."""
    width = slots.tables.shape[1]
    if items.shape[0] < decoding:
        raise refusals.items_too_small(items.shape[0], decoding)
    if outputs.shape[0] < decoding:
        raise refusals.outputs_too_small(outputs.shape[0], decoding)
    if block_tables.shape[0] < decoding * width:
        raise refusals.tables_too_small(block_tables.shape[0], decoding, decoding * width)
    if decoding == 0:
        return 0
    assert refs is not None, "requests decode, yet no call bound a pool"
    code, found, page, holders = lower_round(
        slots.states,
        slots.request_ids,
        slots.next_tokens,
        slots.token_counts,
        slots.token_ready,
        slots.tables,
        refs,
        page_size,
        items,
        block_tables,
        outputs,
        round_slots,
    )
    if code == MISSING_TOKEN:
        raise refusals.missing_input_token(int(slots.request_ids[found]), found)
    if code == UNWRITABLE:
        target = None if page == NO_PAGE else page
        request_id, token_count = int(slots.request_ids[found]), int(slots.token_counts[found])
        raise refusals.unprepared_write(request_id, found, token_count, page_size or None, target, holders, width)
    assert found == decoding, "the DECODE count drifted from the slot states"
    return found


def run_lowered(
    slots: SlotArrays,
    count: int,
    round_slots: npt.NDArray[np.int64],
    backend: Any,
    items: ItemArray,
    block_tables: TableArray,
    outputs: OutputArray,
) -> RaggedBatchReceipt:
    """The one backend call of a round `lower_decode` lowered (`count` requests), and its
    checked answers applied to their slots."""
    if count == 0:
        return RaggedBatchReceipt()
    width = slots.tables.shape[1]
    out = outputs[:count]
    try:
        receipt = backend.execute_ragged(_read_only(items[:count]), _read_only(block_tables[: count * width]), out)
    except Exception as error:
        raise refusals.backend_raised(error) from error
    if not isinstance(receipt, RaggedBatchReceipt):
        raise refusals.not_a_receipt(receipt)
    if receipt.batch_size != count:
        raise refusals.answered_count(receipt.batch_size, count)
    if receipt.backend_launches != 1:
        raise refusals.launch_count(receipt.backend_launches)
    bad = apply_round(
        out, round_slots, count, slots.request_ids, slots.next_tokens, slots.token_counts, slots.token_ready
    )
    if bad >= 0:
        slot = int(round_slots[bad])
        answered = (int(out[bad]["request_id"]), int(out[bad]["slot"]))
        raise refusals.wrong_answer(bad, answered, (int(slots.request_ids[slot]), slot))
    return receipt
