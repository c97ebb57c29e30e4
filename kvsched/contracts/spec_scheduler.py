"""Contracts on the spec's request lifecycle (`spec/scheduler.py`), for CrossHair.

Two request slots (state code 0 empty / 1 prefill / 2 decode, a request id, a 2-entry table),
3 pages, external holders and, for admission, one published prefix (number 0). Postconditions:
every invariant holds after; admission refuses a live id before a full scheduler and takes the
lowest empty slot (a prefix hit goes straight to DECODE); fork copies the parent into the lowest
empty slot sharing its pages; finish empties the slot and frees what only it held, in logical
order; a round lowers, checks and applies exactly as the ABI says.
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.contracts.support import (
    Transition,
    holds,
    identity,
    in_range,
    make_entry,
    make_slot,
    make_system,
    make_table,
    pushed,
    run_step,
)
from kvsched.spec import lifecycle as scheduler_ops
from kvsched.spec import round as round_ops
from kvsched.spec import slots as slot_ops
from kvsched.spec.batch import U32_MAX, RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.errors import KvschedError
from kvsched.spec.invariants import post_written_page_exclusive
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import CopyOnWrite
from kvsched.spec.slots import Admission, RequestState, Slot
from kvsched.spec.system import SystemState


def two_slots(
    s0: int, i0: int, t0: tuple[int, int], s1: int, i1: int, t1: tuple[int, int], e: tuple[int, int, int], order: int
) -> SystemState:
    """Slots from (state code, request id, table); prefix 0 publishes page 2 (for admission)."""
    slots = (make_slot(s0, i0, make_table(*t0)), make_slot(s1, i1, make_table(*t1)))
    return make_system(e, order, slots, (make_entry(0, 4, 0),))


def valid_slots(s0: int, i0: int, s1: int, i1: int) -> bool:
    """Known state codes, small ids, distinct when both live."""
    return in_range(s0, s1) and in_range(i0, i1, high=3) and (s0 == 0 or s1 == 0 or i0 != i1)


def distinct(*entries: int) -> bool:
    """The mapped entries are distinct pages."""
    mapped = [entry for entry in entries if entry >= 0]
    return len(mapped) == len(set(mapped))


def find(state: SystemState, request_id: int) -> int | None:
    """The slot of the live request `request_id`."""
    return slot_ops.find_request(state.scheduler, request_id)


def lowest_empty(state: SystemState) -> int | None:
    """The lowest empty slot."""
    return slot_ops.find_empty_slot(state.scheduler)


def admission_refusal(state: SystemState, request_id: int) -> str | None:
    """The refusal admission owes: a bad id, then a live id, then a full scheduler."""
    if request_id < 0:
        return "InvalidArgument"
    if find(state, request_id) is not None:
        return "DuplicateRequest"
    return "Full" if lowest_empty(state) is None else None


def admits_lowest(step: Transition[Admission], prefix: int) -> bool:
    """The request took the lowest empty slot; a prefix hit admits into DECODE with its tokens."""
    admission, slot_index = step.value, lowest_empty(step.before)
    if admission is None or slot_index is None or admission.slot != slot_index:
        return False
    slot = step.after.scheduler.slots[slot_index]
    hit = prefix == 0
    state = RequestState.DECODE if hit else RequestState.PREFILL
    return admission.prefix_hit == hit and slot.state is state and slot.token_count == admission.prefix_tokens


def forks_into_lowest(step: Transition[int], parent: int, child: int) -> bool:
    """The child is the parent's copy (same table, state and counts) in the lowest empty slot."""
    index, source = lowest_empty(step.before), find(step.before, parent)
    if index is None or source is None or step.value != index:
        return False
    return step.after.scheduler.slots[index] == replace(step.before.scheduler.slots[source], request_id=child)


def finishes(step: Transition[None], request_id: int) -> bool:
    """The slot is empty and cleared, the other is untouched, and the pages only it held were
    pushed on the free stack in logical order."""
    index = find(step.before, request_id)
    if index is None:
        return False
    table = step.before.scheduler.slots[index].table
    last = tuple(page for page in table if page is not None and step.before.pool.refs[page] == 1)
    other = 1 - index
    slots_before, slots_after = step.before.scheduler.slots, step.after.scheduler.slots
    cleared = slots_after[index] == Slot((None, None)) and slots_after[other] == slots_before[other]
    return cleared and pushed(step.before.pool, step.after.pool) == last


def scheduler_admit(
    s0: int, i0: int, s1: int, i1: int, e0: int, e1: int, e2: int, order: int, request_id: int, prefix: int
) -> Transition[Admission]:
    """Admission: duplicates refused before capacity; the lowest empty slot; a hit into DECODE.

    pre: valid_slots(s0, i0, s1, i1) and in_range(e0, e1, e2, high=2) and 0 <= order < 6
    pre: -1 <= request_id <= 4 and -1 <= prefix <= 1
    post: holds(__return__.after)
    post: __return__.error == admission_refusal(__return__.before, request_id)
    post: not __return__.ok or admits_lowest(__return__, prefix)
    """
    before = two_slots(s0, i0, (-1, -1), s1, i1, (-1, -1), (e0, e1, e2), order)

    def transition() -> tuple[SystemState, Admission]:
        ident = None if prefix < 0 else identity(prefix)
        scheduler, pool, store, admission = scheduler_ops.admit(
            before.scheduler, before.pool, before.store, request_id, ident
        )
        return replace(before, scheduler=scheduler, pool=pool, store=store), admission

    return run_step(before, transition)


def scheduler_fork(
    s0: int, i0: int, t00: int, t01: int, s1: int, i1: int, e0: int, e1: int, e2: int, order: int, child: int
) -> Transition[int]:
    """Forking the request in slot 0 copies it into the lowest empty slot, sharing its pages.

    pre: valid_slots(s0, i0, s1, i1) and in_range(t00, t01, low=-1) and distinct(t00, t01)
    pre: in_range(e0, e1, e2, high=1) and 0 <= order < 6 and -1 <= child <= 4
    post: holds(__return__.after)
    post: __return__.ok == (s0 != 0 and child >= 0 and find(__return__.before, child) is None and s1 == 0)
    post: not __return__.ok or forks_into_lowest(__return__, i0, child)
    """
    before = two_slots(s0, i0, (t00, t01), s1, i1, (-1, -1), (e0, e1, e2), order)

    def transition() -> tuple[SystemState, int]:
        scheduler, pool, slot = scheduler_ops.fork(before.scheduler, before.pool, i0 if s0 else 9, child)
        return replace(before, scheduler=scheduler, pool=pool), slot

    return run_step(before, transition)


def scheduler_ensure_writable(
    s0: int, i0: int, t00: int, t01: int, e0: int, e1: int, e2: int, order: int, request_id: int, logical: int
) -> Transition[CopyOnWrite]:
    """A live request's logical page becomes exclusively its own; anything else is refused.

    pre: valid_slots(s0, i0, 0, 0) and in_range(t00, t01, low=-1) and distinct(t00, t01)
    pre: in_range(e0, e1, e2, high=2) and 0 <= order < 6 and -1 <= request_id <= 4 and -1 <= logical <= 2
    post: holds(__return__.after)
    post: not __return__.ok or (find(__return__.before, request_id) == 0 and 0 <= logical < 2)
    post: not __return__.ok or post_written_page_exclusive(__return__.after, request_id, logical)
    """
    before = two_slots(s0, i0, (t00, t01), 0, 0, (-1, -1), (e0, e1, e2), order)

    def transition() -> tuple[SystemState, CopyOnWrite]:
        scheduler, pool, action = scheduler_ops.ensure_writable(before.scheduler, before.pool, request_id, logical)
        return replace(before, scheduler=scheduler, pool=pool), action

    return run_step(before, transition)


def all_exclusive(step: Transition[WritePlan], steps: tuple[tuple[int, int], ...]) -> bool:
    """After the batch, every step's logical page is its request's alone."""
    return all(post_written_page_exclusive(step.after, request_id, logical) for request_id, logical in steps)


def scheduler_ensure_writable_batch(
    s0: int, i0: int, t00: int, t01: int, s1: int, i1: int, e0: int, e1: int, e2: int, order: int, r: int, logical: int
) -> Transition[WritePlan]:
    """A batch of writes (logical pages 0 and `logical` of request `r`, then page 0 of request `i1`)
    runs whole, each write landing on a page its request owns alone, or changes nothing.

    pre: valid_slots(s0, i0, s1, i1) and in_range(t00, t01, low=-1) and distinct(t00, t01)
    pre: in_range(e0, e1, e2, high=1) and 0 <= order < 6 and -1 <= r <= 4 and -1 <= logical <= 2
    post: holds(__return__.after)
    post: not __return__.ok or all_exclusive(__return__, ((r, 0), (r, logical), (i1, 0)))
    """
    before = two_slots(s0, i0, (t00, t01), s1, i1, (t00, -1), (e0, e1, e2), order)

    def transition() -> tuple[SystemState, WritePlan]:
        ids, pages = (r, r, i1), (0, logical, 0)
        scheduler, pool, plan = scheduler_ops.ensure_writable_batch(before.scheduler, before.pool, ids, pages)
        return replace(before, scheduler=scheduler, pool=pool), plan

    return run_step(before, transition)


def scheduler_finish(
    s0: int, i0: int, t00: int, t01: int, s1: int, i1: int, t10: int, e0: int, e1: int, e2: int, order: int, rid: int
) -> Transition[None]:
    """Finishing (or cancelling) empties the slot and frees what only it held, LIFO.

    pre: valid_slots(s0, i0, s1, i1) and in_range(t00, t01, t10, low=-1) and distinct(t00, t01)
    pre: in_range(e0, e1, e2, high=1) and 0 <= order < 6 and -1 <= rid <= 4
    post: holds(__return__.after)
    post: __return__.ok == (rid >= 0 and find(__return__.before, rid) is not None)
    post: not __return__.ok or finishes(__return__, rid)
    """
    before = two_slots(s0, i0, (t00, t01), s1, i1, (t10, -1), (e0, e1, e2), order)

    def transition() -> tuple[SystemState, None]:
        scheduler, pool = scheduler_ops.finish(before.scheduler, before.pool, rid)
        return replace(before, scheduler=scheduler, pool=pool), None

    return run_step(before, transition)


def lower_item(request_id: int, token: int, count: int, ready: bool, index: int, offset: int) -> RaggedBatchItem | str:
    """A decoding slot lowers to its ABI item; one without an input token is refused.

    pre: in_range(request_id, high=2**64 - 1) and in_range(token, count, offset, high=U32_MAX) and 0 <= index <= 1
    post: (__return__ == "MissingInputToken") == (not ready)
    post: not ready or __return__ == RaggedBatchItem(request_id, index, token, count, offset, 2, 0)
    """
    slot = Slot((None, None), request_id, RequestState.DECODE, count, 0, token, ready)
    slots = (slot, slot) if index else (slot, Slot((None, None)))
    try:
        return round_ops.lower_item(slot_ops.SchedulerState(slots), index, offset)
    except KvschedError as error:
        return type(error).__name__


ITEMS = (RaggedBatchItem(7, 0, 1, 2, 0, 2), RaggedBatchItem(9, 1, 3, 4, 2, 2))


def answers(count: int, outputs: tuple[RaggedBatchOutput, ...]) -> bool:
    """Every output answers its item (request id and slot) with a u32 token."""
    pairs = zip(ITEMS[:count], outputs[:count], strict=True)
    return all(o.request_id == i.request_id and o.slot == i.slot and 0 <= o.next_token_id <= U32_MAX for i, o in pairs)


def check_outputs(
    count: int, batch: int, launches: int, r0: int, s0: int, n0: int, r1: int, s1: int, n1: int
) -> tuple[str | None, tuple[RaggedBatchOutput, ...]]:
    """A round's answer is accepted iff the receipt counts the batch and one launch and every
    output answers its item; a wrong batch size is reported before a wrong launch count.

    pre: 0 <= count <= 2 and -1 <= batch <= 3 and 0 <= launches <= 2
    post: (__return__[0] is None) == (batch == count and launches == 1 and answers(count, __return__[1]))
    post: batch == count or __return__[0] == "OutputIdentityMismatch"
    """
    outputs = (RaggedBatchOutput(r0, s0, n0), RaggedBatchOutput(r1, s1, n1))
    receipt = RaggedBatchReceipt(batch, launches, 16 * count)
    try:
        round_ops.check_outputs(ITEMS[:count], receipt, list(outputs[:count]))
    except KvschedError as error:
        return type(error).__name__, outputs
    return None, outputs


def advances(step: Transition[None], answered: tuple[int, ...], tokens: tuple[int, int]) -> bool:
    """Each answered slot consumed one token (saturating) and holds its next one; the other
    slots are untouched."""
    for index, (old, new) in enumerate(zip(step.before.scheduler.slots, step.after.scheduler.slots, strict=True)):
        if index not in answered:
            if new != old:
                return False
            continue
        expected = replace(old, token_count=min(old.token_count + 1, U32_MAX), next_token_id=tokens[index])
        if new != replace(expected, token_ready=True):
            return False
    return True


def apply_outputs(count0: int, count1: int, token0: int, token1: int, answered: int) -> Transition[None]:
    """Applying a checked round advances exactly the answered slots.

    pre: in_range(count0, count1, token0, token1, high=U32_MAX) and 0 <= answered <= 3
    post: holds(__return__.after)
    post: advances(__return__, tuple(i for i in (0, 1) if answered >> i & 1), (token0, token1))
    """
    slots = (
        Slot((None, None), 7, RequestState.DECODE, count0, 0, 0, True),
        Slot((None, None), 9, RequestState.DECODE, count1, 0, 0, False),
    )
    before = make_system((0, 0, 0), 0, slots)
    outputs = [RaggedBatchOutput((7, 9)[i], i, (token0, token1)[i]) for i in (0, 1) if answered >> i & 1]

    def transition() -> tuple[SystemState, None]:
        return replace(before, scheduler=round_ops.commit_round(before.scheduler, outputs)), None

    return run_step(before, transition)


# The names only the docstring conditions use (CrossHair evaluates them in this module's globals).
CONDITION_VOCABULARY = (holds, post_written_page_exclusive)
