"""A concrete spec `SystemState` as a ground `Sys`: the bridge from the code to the z3 model.

Every array is built canonically (a constant default with stores at the meaningful indices),
the ghost inverses are computed, and the ghost owner counters are the *true* counts of the
state: so a model post-state equals the encoding of the spec's post-state exactly when the
model's transition (ghost updates included) did what the spec did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import z3

from kvsched.proofs.model import DECODE, EMPTY, INT, NONE, PREFILL, Arr, Sys
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.slots import RequestState
from kvsched.spec.system import SystemState
from kvsched.spec.table import get_mapped_pages

PHASES = {RequestState.EMPTY: EMPTY, RequestState.PREFILL: PREFILL, RequestState.DECODE: DECODE}


def identity_value(identity: PrefixIdentity) -> int:
    """A prefix identity as one integer (its four words; injective)."""
    value = 0
    for word in reversed(identity.words):
        value = (value << 64) | word
    return value


def array(items: Iterable[tuple[int, int | bool]], default: int | bool) -> Arr:
    """A z3 array: `default` everywhere but at the given indices."""
    result = z3.K(INT, z3.BoolVal(default) if isinstance(default, bool) else z3.IntVal(default))
    for index, value in items:
        result = z3.Store(result, index, value)
    return result


def _rows(rows: Iterable[tuple[int, Iterable[tuple[int, int]]]]) -> Arr:
    result = z3.K(INT, array((), NONE))
    for index, items in rows:
        result = z3.Store(result, index, array(items, NONE))
    return result


def encode(state: SystemState) -> Sys:
    """The ground model of `state`: arrays, ghost inverses and true owner counts."""
    pool, store, slots = state.pool, state.store, state.scheduler.slots
    entries = [(index, entry) for index, entry in enumerate(store.entries) if entry is not None]
    table_refs: Counter[int] = Counter(page for slot in slots for page in get_mapped_pages(slot.table))
    store_refs: Counter[int] = Counter(page for _, entry in entries for page in entry.page_set.pages)

    def mapped(row: tuple[int | None, ...]) -> list[tuple[int, int]]:
        return [(logical, page) for logical, page in enumerate(row) if page is not None]

    def nonzero(values: Iterable[int]) -> list[tuple[int, int]]:
        return [(index, value) for index, value in enumerate(values) if value]

    return Sys(
        pages=z3.IntVal(len(pool.refs)),
        max_refs=z3.IntVal(pool.max_references),
        requests=z3.IntVal(len(slots)),
        width=z3.IntVal(len(slots[0].table)),
        entries=z3.IntVal(len(store.entries)),
        capacity=z3.IntVal(store.page_capacity),
        refs=array(nonzero(pool.refs), 0),
        stack=array(enumerate(pool.free), NONE),
        top=z3.IntVal(len(pool.free)),
        pos=array(((page, index) for index, page in enumerate(pool.free)), NONE),
        held=z3.IntVal(sum(1 for count in pool.refs if count > 0)),
        table=_rows((r, mapped(slot.table)) for r, slot in enumerate(slots) if get_mapped_pages(slot.table)),
        tpos=_rows(
            (r, [(page, logical) for logical, page in mapped(slot.table)])
            for r, slot in enumerate(slots)
            if get_mapped_pages(slot.table)
        ),
        phase=array(nonzero(PHASES[slot.state] for slot in slots), 0),
        rid=array(nonzero(slot.request_id for slot in slots), 0),
        tokens=array(nonzero(slot.token_count for slot in slots), 0),
        ptok=array(nonzero(slot.prefix_tokens for slot in slots), 0),
        nexttok=array(nonzero(slot.next_token_id for slot in slots), 0),
        ready=array(((r, True) for r, slot in enumerate(slots) if slot.token_ready), False),
        ent=_rows((e, enumerate(entry.page_set.pages)) for e, entry in entries),
        epos=_rows((e, ((page, i) for i, page in enumerate(entry.page_set.pages))) for e, entry in entries),
        elen=array(((e, len(entry.page_set.pages)) for e, entry in entries), 0),
        eid=array(((e, identity_value(entry.page_set.identity)) for e, entry in entries), 0),
        etok=array(((e, entry.page_set.token_count) for e, entry in entries), 0),
        eused=array(((e, entry.last_used) for e, entry in entries if entry.last_used), 0),
        victim=z3.IntVal(store.next_victim),
        clock=z3.IntVal(store.clock),
        tcnt=array(table_refs.items(), 0),
        scnt=array(store_refs.items(), 0),
        ext=array(Counter(state.external).items(), 0),
        pend=array((), 0),
    )
