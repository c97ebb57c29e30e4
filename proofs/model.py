"""The z3 model of a kvsched system state, for every size at once.

A `Sys` is one `SystemState` (spec/system.py) as z3 terms: pool, request slots, prefix store and
owner counts. Sizes (pages, slots, table width, store entries) are symbolic integers, so a proof
about a `Sys` holds for pools, schedulers and tables of every size.

    spec                              model
    pool.refs[p]                      refs[p]                       (0 outside 0..pages-1)
    pool.free  (top = last)           stack[0..top-1], pos[p]       (pos: ghost inverse, NONE if held)
    held pages                        held                          (ghost: free + held = total)
    slots[r].table[l]                 table[r][l], tpos[r][p]       (tpos: ghost inverse per row)
    slots[r] fields                   phase, rid, tokens, ptok, nexttok, ready
    store.entries[e]                    ent[e][i], epos[e][p], elen, eid, etok, eused
    owner references per page         tcnt (tables), scnt (store), ext (external), pend

Every array is canonical: outside its meaningful range it holds NONE (or 0, or False), so two
models of the same spec state are equal as arrays, and the conformance test can compare a model
post-state with the encoding of the spec's post-state by plain equality.

`pend` counts references a multi-page transition holds *in flight* (retained but not yet
visible in an owner, or detached from an owner but not yet released); a committed state has
none. It is how a loop over a page list is split into one-page steps (see transitions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeAlias

import z3

NONE = -1  # unmapped entry, empty stack cell, "not in this list": the model's one sentinel
EMPTY, PREFILL, DECODE = 0, 1, 2  # RequestState as integers
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

INT = z3.IntSort()
INT_ARRAY = z3.ArraySort(INT, INT)
ROWS = z3.ArraySort(INT, INT_ARRAY)
BOOL_ARRAY = z3.ArraySort(INT, z3.BoolSort())

# z3 ships no type information: these aliases name what a term is, for the reader.
Int: TypeAlias = Any  # z3.ArithRef
Arr: TypeAlias = Any  # z3.ArrayRef
Bool: TypeAlias = Any  # z3.BoolRef

DIMENSIONS = ("pages", "max_refs", "requests", "width", "entries", "capacity")


@dataclass(frozen=True)
class Sys:
    """One system state as z3 terms; the six dimensions never change in a transition."""

    pages: Int
    max_refs: Int
    requests: Int
    width: Int
    entries: Int
    capacity: Int
    refs: Arr
    stack: Arr
    top: Int
    pos: Arr
    held: Int
    table: Arr
    tpos: Arr
    phase: Arr
    rid: Arr
    tokens: Arr
    ptok: Arr
    nexttok: Arr
    ready: Arr
    ent: Arr
    epos: Arr
    elen: Arr
    eid: Arr
    etok: Arr
    eused: Arr
    victim: Int
    clock: Int
    tcnt: Arr
    scnt: Arr
    ext: Arr
    pend: Arr

    def with_(self, **changes: Any) -> Sys:
        """A copy with some fields replaced (a transition's post-state)."""
        return replace(self, **changes)


_SORTS: dict[str, z3.SortRef] = {
    "table": ROWS,
    "tpos": ROWS,
    "ent": ROWS,
    "epos": ROWS,
    "ready": BOOL_ARRAY,
}
_SCALARS = frozenset({*DIMENSIONS, "top", "held", "victim", "clock"})
FIELDS = tuple(field.name for field in fields(Sys))


def fresh(name: str, dimensions: Sys | None = None) -> Sys:
    """A fully symbolic state; with `dimensions`, one that shares that state's sizes."""
    values: dict[str, Any] = {}
    for field_name in FIELDS:
        if dimensions is not None and field_name in DIMENSIONS:
            values[field_name] = getattr(dimensions, field_name)
        elif field_name in _SCALARS:
            values[field_name] = z3.Int(f"{name}.{field_name}")
        else:
            values[field_name] = z3.Const(f"{name}.{field_name}", _SORTS.get(field_name, INT_ARRAY))
    return Sys(**values)


def same(left: Sys, right: Sys) -> Bool:
    """The two states are equal in every field (arrays extensionally)."""
    return z3.And([getattr(left, name) == getattr(right, name) for name in FIELDS])


def pick(condition: Bool, then: Sys, otherwise: Sys) -> Sys:
    """Field-wise if-then-else: a transition that branches on a state condition."""
    values = {name: z3.If(condition, getattr(then, name), getattr(otherwise, name)) for name in FIELDS}
    return Sys(**values)


def between(low: Any, value: Any, high: Any) -> Bool:
    """low <= value < high."""
    return z3.And(low <= value, value < high)


def in_pages(s: Sys, page: Any) -> Bool:
    """`page` names a physical page of this pool."""
    return between(0, page, s.pages)


def in_slots(s: Sys, slot: Any) -> Bool:
    """`slot` is a request slot."""
    return between(0, slot, s.requests)


def in_width(s: Sys, logical: Any) -> Bool:
    """`logical` is a logical page of a table."""
    return between(0, logical, s.width)


def in_entries(s: Sys, entry: Any) -> Bool:
    """`entry` is a store slot."""
    return between(0, entry, s.entries)


def is_live(s: Sys, slot: Any) -> Bool:
    """The slot holds a request (PREFILL or DECODE)."""
    return z3.And(in_slots(s, slot), s.phase[slot] != EMPTY)


def is_u64(value: Any) -> Bool:
    """A valid request id."""
    return z3.And(value >= 0, value <= U64_MAX)


def is_u32(value: Any) -> Bool:
    """A valid token id or count."""
    return z3.And(value >= 0, value <= U32_MAX)


def one_if(condition: Bool) -> Int:
    """1 when `condition` holds, else 0 (a count's contribution)."""
    result: Int = z3.If(condition, 1, 0)
    return result


def bump(array: Arr, index: Any, delta: Any) -> Arr:
    """`array` with `array[index] + delta` at `index`."""
    return z3.Store(array, index, array[index] + delta)


def set_row(rows: Arr, index: Any, column: Any, value: Any) -> Arr:
    """`rows` with `rows[index][column] = value`."""
    return z3.Store(rows, index, z3.Store(rows[index], column, value))


def empty_row() -> Arr:
    """A row of NONE: an unmapped table, an empty store entry, an empty inverse."""
    return z3.K(INT, z3.IntVal(NONE))


def bound(names: str) -> list[Int]:
    """Variables for a quantifier or lambda, in a namespace no free constant uses.

    z3 binds a quantified variable by *name*: `ForAll([Int("i")], ...)` would also capture a
    free constant called "i" in the body (a list index, say) and silently prove something else.
    """
    return [z3.Int(f"bound.{name}") for name in names.split()]
