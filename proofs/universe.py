"""Where the obligations' states come from: every size (proofs) or one small size (witnesses).

`UNBOUNDED` gives fully symbolic states: an `unsat` answer about them is a proof for every pool
size, slot count, table width and store size. z3 cannot build models of their quantified
invariant, so for the opposite question, "is there a state where this fails?", `Bounded` gives
states of fixed small sizes whose array *contents* are still free variables. A counterexample
found there is a real state of the unbounded model (the bounded states are a subset), so it
refutes a broken encoding; hypotheses satisfiable there are not vacuous anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import z3

from kvsched.proofs.model import INT, INT_ARRAY, NONE, Arr, Bool, Sys, fresh

Over = Literal["pages", "slots", "list"]


class Universe(Protocol):
    """A source of pre-states and of free arrays (page lists, backend outputs)."""

    @property
    def name(self) -> str:
        """What the universe is called in reports."""
        ...

    def state(self, name: str) -> Sys:
        """A pre-state."""
        ...

    def array(self, name: str, over: Over, default: int) -> Arr:
        """A free array indexed by pages (and NONE), slots or list positions."""
        ...

    def exact(self, s: Sys) -> Bool:
        """Constraints making `s` a state some spec state encodes (true counts); True if unknown."""
        ...


class _Unbounded:
    name = "unbounded"

    def state(self, name: str) -> Sys:
        return fresh(name)

    def array(self, name: str, over: Over, default: int) -> Arr:
        return z3.Const(name, INT_ARRAY)

    def exact(self, s: Sys) -> Bool:
        # Sums over unbounded ranges are what the ghost counters exist to avoid.
        return z3.BoolVal(True)


UNBOUNDED: Universe = _Unbounded()


def _chain(name: str, indices: range, default: z3.ExprRef, sort: z3.SortRef = INT) -> Arr:
    array = z3.K(INT, default)
    for index in indices:
        array = z3.Store(array, index, z3.Const(f"{name}[{index}]", sort))
    return array


def _rows(name: str, outer: range, inner: range) -> Arr:
    array = z3.K(INT, z3.K(INT, z3.IntVal(NONE)))
    for index in outer:
        array = z3.Store(array, index, _chain(f"{name}[{index}]", inner, z3.IntVal(NONE)))
    return array


@dataclass(frozen=True)
class Bounded:
    """States of these sizes, canonical outside their ranges, free inside."""

    pages: int = 2
    requests: int = 2
    width: int = 2
    entries: int = 1
    capacity: int = 2
    max_refs: int = 2
    name: str = "bounded"

    def state(self, name: str) -> Sys:
        pages, slots, entries = range(self.pages), range(self.requests), range(self.entries)
        none, zero = z3.IntVal(NONE), z3.IntVal(0)

        def ints(field: str, over: range, default: z3.ExprRef = zero) -> Arr:
            return _chain(f"{name}.{field}", over, default)

        return Sys(
            pages=z3.IntVal(self.pages),
            max_refs=z3.IntVal(self.max_refs),
            requests=z3.IntVal(self.requests),
            width=z3.IntVal(self.width),
            entries=z3.IntVal(self.entries),
            capacity=z3.IntVal(self.capacity),
            refs=ints("refs", pages),
            stack=ints("stack", pages, none),
            top=z3.Int(f"{name}.top"),
            pos=ints("pos", pages, none),
            held=z3.Int(f"{name}.held"),
            table=_rows(f"{name}.table", slots, range(self.width)),
            tpos=_rows(f"{name}.tpos", slots, pages),
            phase=ints("phase", slots),
            rid=ints("rid", slots),
            tokens=ints("tokens", slots),
            ptok=ints("ptok", slots),
            nexttok=ints("nexttok", slots),
            ready=_chain(f"{name}.ready", slots, z3.BoolVal(False), z3.BoolSort()),
            ent=_rows(f"{name}.ent", entries, range(self.capacity)),
            epos=_rows(f"{name}.epos", entries, pages),
            elen=ints("elen", entries),
            eid=ints("eid", entries),
            etok=ints("etok", entries),
            eused=ints("eused", entries),
            victim=z3.Int(f"{name}.victim"),
            clock=z3.Int(f"{name}.clock"),
            tcnt=ints("tcnt", pages),
            scnt=ints("scnt", pages),
            ext=ints("ext", pages),
            pend=ints("pend", pages),
        )

    def array(self, name: str, over: Over, default: int) -> Arr:
        indices = {
            "pages": range(NONE, self.pages),
            "slots": range(self.requests),
            "list": range(max(self.width, self.capacity)),
        }[over]
        return _chain(name, indices, z3.IntVal(default))

    def exact(self, s: Sys) -> Bool:
        """Ghost counters equal the true counts, so a counterexample is a real state."""
        slots, logical, entries = range(self.requests), range(self.width), range(self.entries)

        def count(condition: list[Bool]) -> z3.ArithRef:
            return z3.Sum([z3.If(c, 1, 0) for c in condition]) if condition else z3.IntVal(0)

        parts = [s.held == count([s.refs[p] > 0 for p in range(self.pages)])]
        for page in range(self.pages):
            parts.append(s.tcnt[page] == count([s.table[r][k] == page for r in slots for k in logical]))
            listed = [z3.And(i < s.elen[e], s.ent[e][i] == page) for e in entries for i in range(self.capacity)]
            parts.append(s.scnt[page] == count(listed))
        return z3.And(parts)


def describe(model: z3.ModelRef, s: Sys, bounded: Bounded) -> str:
    """A bounded pre-state as its arrays' contents in range, and the step's arguments."""

    def row(array: Arr, size: int) -> list[object]:
        return [model.eval(array[index], model_completion=True) for index in range(size)]

    top = model.eval(s.top, model_completion=True)
    stack = row(s.stack, bounded.pages)
    lines = [
        f"refs={row(s.refs, bounded.pages)} free(top last)={stack[: top.as_long() if z3.is_int_value(top) else 0]}",
        f"owners: tables={row(s.tcnt, bounded.pages)} store={row(s.scnt, bounded.pages)} "
        f"external={row(s.ext, bounded.pages)} in-flight={row(s.pend, bounded.pages)}",
    ]
    for slot in range(bounded.requests):
        lines.append(
            f"slot {slot}: phase={model.eval(s.phase[slot], model_completion=True)} "
            f"id={model.eval(s.rid[slot], model_completion=True)} table={row(s.table[slot], bounded.width)} "
            f"tokens={model.eval(s.tokens[slot], model_completion=True)} "
            f"prefix={model.eval(s.ptok[slot], model_completion=True)}"
        )
    for entry in range(bounded.entries):
        lines.append(
            f"entry {entry}: pages={row(s.ent[entry], bounded.capacity)} "
            f"length={model.eval(s.elen[entry], model_completion=True)} "
            f"identity={model.eval(s.eid[entry], model_completion=True)}"
        )
    arguments = [
        f"{declaration.name()}={model[declaration]}"
        for declaration in sorted(model.decls(), key=str)
        if declaration.arity() == 0 and "." not in declaration.name() and "[" not in declaration.name()
    ]
    lines.append("arguments: " + (", ".join(arguments) or "none"))
    return "\n".join(lines)
