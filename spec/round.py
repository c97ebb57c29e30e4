"""The ragged decode round as pure steps: check and lower the batch, check the answer, commit.

    lower_round(state, pool, page_size)  -> (items, tables)   or raises; nothing changes
    call_round(backend, items, tables, outputs) -> receipt   the one backend call, its answer checked
    check_outputs(items, receipt, outputs)                   the backend answered exactly these
    commit_round(state, outputs)         -> the state after the round

A round makes exactly one backend call for every DECODE request, in slot order, each item
carrying its table's offset in the concatenated tables; it identity-checks the whole output
batch and only then mutates. The backend sees every output position set to `UNANSWERED` (slot
2**32 - 1, which no scheduler has), so an output it never writes cannot pass as a stale answer
from an earlier round, nor as an answer for request 0 in slot 0; it must not call back into the
scheduler. Each request writes its token at position `token_count`, into logical page
`token_count // page_size`: the round refuses (`UnpreparedWrite`) unless that page is mapped and
held by the request alone, so a round can never write a page another owner reads; with no page
size, every page of the request's table must be its own.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from dataclasses import replace

from kvsched.spec import refusals
from kvsched.spec import table as table_ops
from kvsched.spec.batch import U32_MAX, RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt, RaggedDecodeBackend
from kvsched.spec.errors import InvalidArgument, OutputIdentityMismatch
from kvsched.spec.pool import PoolState, get_ref_count
from kvsched.spec.slots import SchedulerState, get_decoding_slots, with_slot


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
    return RaggedBatchItem(
        request_id=slot.request_id,
        slot=index,
        token_id=slot.next_token_id,
        position=slot.token_count,
        block_table_offset=offset,
        logical_pages=len(slot.table),
    )


def lower_round(
    state: SchedulerState, pool: PoolState | None, page_size: int | None
) -> tuple[tuple[RaggedBatchItem, ...], tuple[int, ...]]:
    """The round's items and concatenated tables, once every DECODE request has a seeded token
    and (with `pool`: None only when no request was ever admitted) a write target of its own."""
    decoding = get_decoding_slots(state)
    for index in decoding:
        require_input_token(state, index)
    if pool is not None:
        for index in decoding:
            require_write_target(state, pool, page_size, index)
    width = len(state.slots[0].table)
    items = tuple(lower_item(state, index, position * width) for position, index in enumerate(decoding))
    tables = tuple(entry for index in decoding for entry in table_ops.to_abi(state.slots[index].table))
    return items, tables


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


def call_round(
    backend: RaggedDecodeBackend,
    items: tuple[RaggedBatchItem, ...],
    tables: tuple[int, ...],
    outputs: list[RaggedBatchOutput],
) -> RaggedBatchReceipt:
    """The round's one backend call on lowered `items` and `tables`; the backend writes
    `outputs` (one `UNANSWERED` per item when called). Whatever it raises becomes
    `BackendFailed`; the receipt, once the outputs answer exactly these items (`check_outputs`)."""
    try:
        receipt = backend.execute_ragged(items, tables, outputs)
    except Exception as error:
        raise refusals.backend_raised(error) from error
    if len(outputs) != len(items):
        raise refusals.outputs_resized(len(outputs), len(items))
    return check_outputs(items, receipt, outputs)


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


def commit_round(state: SchedulerState, outputs: list[RaggedBatchOutput]) -> SchedulerState:
    """Commit a checked round: each request consumes its token and gets the next one."""
    for output in outputs:
        slot = state.slots[output.slot]
        advanced = replace(
            slot,
            next_token_id=output.next_token_id,
            token_count=min(slot.token_count + 1, U32_MAX),
            token_ready=True,
        )
        state = with_slot(state, output.slot, advanced)
    return state
