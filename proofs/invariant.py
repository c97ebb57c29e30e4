"""The inductive invariant, as named z3 conjuncts over a `Sys`, and the counting facts.

Each conjunct names the `inv_*` function of spec/invariants.py it carries (`CONJUNCTS`); a few
are model-level (`carries` None: sizes in their domains, nothing in flight) and exist so the
spec's invariants become inductive. `inv_tables_fixed_capacity` holds by construction: the model
has one `width`. That the carried conjuncts say what the spec's predicates say is checked on
concrete states by agreement.py.

Counting without sums: owner references per page are ghost counters (`tcnt`, `scnt`, `ext`,
`pend`) that every transition updates at the pages it touches, so "refcount = owners" is
checked pointwise (the changed page plus an unchanged remainder) instead of as a sum over
every table entry. Two facts about such counters hold in every state whose counters are the
true counts, and are assumed of every pre-state (`counting_facts`): a page a table maps is
counted at least once by `tcnt`, a page a store entry lists at least once by `scnt`. That the
counters *are* the true counts is what the conformance test checks against the spec.

"free + held = total" is a ghost `held` (pages with a nonzero count) with `top + held == pages`;
that `top <= pages` then needs `held >= 0`, a pigeonhole fact z3 cannot find by instantiation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.model import (
    DECODE,
    EMPTY,
    NONE,
    PREFILL,
    Bool,
    Sys,
    between,
    bound,
    in_entries,
    in_pages,
    in_slots,
    in_width,
    is_live,
    is_u32,
    is_u64,
)
from kvsched.spec.invariants import (
    Invariant,
    inv_cache_well_formed,
    inv_empty_slots_cleared,
    inv_free_stack_exact,
    inv_prefix_tokens_within_count,
    inv_refcount_equals_owners,
    inv_refcounts_bounded,
    inv_request_ids_unique,
    inv_store_entries_well_formed,
    inv_tables_fixed_capacity,
    inv_tables_hold_their_pages,
)


@dataclass(frozen=True)
class Conjunct:
    """One named part of the inductive invariant and the spec invariant it carries (None: model-level)."""

    name: str
    carries: Invariant | None
    holds: Callable[[Sys], Bool]
    note: str = ""

    @property
    def label(self) -> str:
        """What the conjunct carries, for reports: the invariant's name, or the model's note."""
        name = self.carries.__name__ if self.carries is not None else "model"
        return f"{name} ({self.note})" if self.note else name


def _dimensions(s: Sys) -> Bool:
    return z3.And(
        s.pages >= 0,
        s.max_refs >= 1,
        s.requests >= 1,
        s.width >= 1,
        s.entries >= 0,
        s.capacity >= 1,
        s.top >= 0,
        s.clock >= 0,
        s.victim >= 0,
    )


def _free_stack_exact(s: Sys) -> Bool:
    i, p = bound("i p")
    return z3.And(
        z3.ForAll(
            [i],
            z3.If(
                between(0, i, s.top),
                z3.And(in_pages(s, s.stack[i]), s.pos[s.stack[i]] == i),
                s.stack[i] == NONE,
            ),
        ),
        z3.ForAll(
            [p],
            z3.Or(
                s.pos[p] == NONE,
                z3.And(in_pages(s, p), between(0, s.pos[p], s.top), s.stack[s.pos[p]] == p),
            ),
        ),
        z3.ForAll([p], z3.Implies(in_pages(s, p), (s.refs[p] == 0) == (s.pos[p] != NONE))),
        s.top + s.held == s.pages,
    )


def _refcount_equals_owners(s: Sys) -> Bool:
    (p,) = bound("p")
    owners = s.tcnt[p] + s.scnt[p] + s.ext[p] + s.pend[p]
    return z3.ForAll(
        [p],
        z3.And(
            s.tcnt[p] >= 0,
            s.scnt[p] >= 0,
            s.ext[p] >= 0,
            s.pend[p] >= 0,
            z3.If(in_pages(s, p), s.refs[p] == owners, z3.And(s.refs[p] == 0, owners == 0)),
        ),
    )


def _refcounts_bounded(s: Sys) -> Bool:
    (p,) = bound("p")
    return z3.ForAll([p], z3.Implies(in_pages(s, p), z3.And(s.refs[p] >= 0, s.refs[p] <= s.max_refs)))


def _tables_hold_their_pages(s: Sys) -> Bool:
    r, k, p = bound("r k p")
    page = s.table[r][k]
    return z3.And(
        z3.ForAll(
            [r, k],
            z3.Implies(
                page != NONE,
                z3.And(in_slots(s, r), in_width(s, k), in_pages(s, page), s.refs[page] >= 1, s.tpos[r][page] == k),
            ),
        ),
        z3.ForAll(
            [r, p],
            z3.Implies(
                s.tpos[r][p] != NONE,
                z3.And(in_slots(s, r), in_pages(s, p), in_width(s, s.tpos[r][p]), s.table[r][s.tpos[r][p]] == p),
            ),
        ),
    )


def _empty_slots_cleared(s: Sys) -> Bool:
    r, k = bound("r k")
    empty = s.phase[r] == EMPTY
    cleared = z3.And(s.rid[r] == 0, s.tokens[r] == 0, s.ptok[r] == 0, s.nexttok[r] == 0, z3.Not(s.ready[r]))
    return z3.And(
        z3.ForAll([r], z3.Implies(empty, cleared)),
        z3.ForAll([r, k], z3.Implies(empty, s.table[r][k] == NONE)),
        z3.ForAll(
            [r],
            z3.And(
                z3.Or(empty, s.phase[r] == PREFILL, s.phase[r] == DECODE),
                z3.Implies(z3.Not(in_slots(s, r)), empty),
            ),
        ),
    )


def _request_ids_unique(s: Sys) -> Bool:
    r1, r2 = bound("r1 r2")
    return z3.ForAll(
        [r1, r2],
        z3.Implies(z3.And(is_live(s, r1), is_live(s, r2), s.rid[r1] == s.rid[r2]), r1 == r2),
    )


def _prefix_tokens_within_count(s: Sys) -> Bool:
    (r,) = bound("r")
    return z3.ForAll(
        [r],
        z3.Implies(
            is_live(s, r),
            z3.And(
                s.ptok[r] >= 0, s.ptok[r] <= s.tokens[r], is_u32(s.tokens[r]), is_u64(s.rid[r]), is_u32(s.nexttok[r])
            ),
        ),
    )


def _store_entries_well_formed(s: Sys) -> Bool:
    e, e2 = bound("e e2")
    occupied = s.elen[e] > 0
    return z3.And(
        z3.ForAll(
            [e],
            z3.And(
                z3.If(in_entries(s, e), z3.And(s.elen[e] >= 0, s.elen[e] <= s.capacity), s.elen[e] == 0),
                z3.Implies(z3.Not(occupied), z3.And(s.eid[e] == 0, s.etok[e] == 0, s.eused[e] == 0)),
                z3.Implies(
                    occupied, z3.And(s.etok[e] >= 1, s.etok[e] <= 2**32 - 1, s.eused[e] >= 0, s.eused[e] < s.clock)
                ),
            ),
        ),
        z3.ForAll(
            [e, e2],
            z3.Implies(z3.And(s.elen[e] > 0, s.elen[e2] > 0, s.eid[e] == s.eid[e2]), e == e2),
        ),
    )


def _store_pages_held(s: Sys) -> Bool:
    e, i, p = bound("e i p")
    page = s.ent[e][i]
    return z3.And(
        z3.ForAll(
            [e, i],
            z3.If(
                between(0, i, s.elen[e]),
                z3.And(in_pages(s, page), s.refs[page] >= 1, s.epos[e][page] == i),
                page == NONE,
            ),
        ),
        z3.ForAll(
            [e, p],
            z3.Implies(
                s.epos[e][p] != NONE,
                z3.And(in_pages(s, p), between(0, s.epos[e][p], s.elen[e]), s.ent[e][s.epos[e][p]] == p),
            ),
        ),
    )


def _nothing_pending(s: Sys) -> Bool:
    (p,) = bound("p")
    return z3.ForAll([p], s.pend[p] == 0)


def _pool_counts(s: Sys) -> Bool:
    (p,) = bound("p")
    return z3.ForAll([p], z3.If(in_pages(s, p), z3.And(s.refs[p] >= 0, s.refs[p] <= s.max_refs), s.refs[p] == 0))


SETTLED = Conjunct("nothing_pending", None, _nothing_pending, "a committed state holds no in-flight reference")

GENERAL: tuple[Conjunct, ...] = (
    Conjunct("dimensions", None, _dimensions, "sizes are in their domains"),
    Conjunct("free_stack_exact", inv_free_stack_exact, _free_stack_exact),
    Conjunct("refcount_equals_owners", inv_refcount_equals_owners, _refcount_equals_owners),
    Conjunct("refcounts_bounded", inv_refcounts_bounded, _refcounts_bounded),
    Conjunct("tables_hold_their_pages", inv_tables_hold_their_pages, _tables_hold_their_pages),
    Conjunct("empty_slots_cleared", inv_empty_slots_cleared, _empty_slots_cleared),
    Conjunct("request_ids_unique", inv_request_ids_unique, _request_ids_unique),
    Conjunct("prefix_tokens_within_count", inv_prefix_tokens_within_count, _prefix_tokens_within_count),
    Conjunct("store_entries_well_formed", inv_store_entries_well_formed, _store_entries_well_formed),
    Conjunct("store_pages_held", inv_refcount_equals_owners, _store_pages_held, "store side"),
)
"""The invariant of every state, in flight or not."""

CONJUNCTS: tuple[Conjunct, ...] = (*GENERAL, SETTLED)
"""The invariant of every committed state."""

POOL: tuple[Conjunct, ...] = (
    Conjunct("pool_dimensions", None, lambda s: z3.And(s.pages >= 0, s.max_refs >= 1, s.top >= 0), "sizes"),
    GENERAL[1],
    Conjunct("pool_refcounts_in_range", inv_refcounts_bounded, _pool_counts),
)
"""The pool's own invariant: what allocate/retain/release/writable keep with no owner model."""

SPEC_INVARIANTS_BY_CONSTRUCTION: tuple[Invariant, ...] = (inv_tables_fixed_capacity, inv_cache_well_formed)
"""Spec invariants no conjunct carries: the model cannot state their violation (one `width`; no
automatic cache, whose conservation `kvsched.proofs.cache_conservation` proves on its own)."""


def general(s: Sys) -> Bool:
    """The invariant of a state with references in flight."""
    return z3.And([conjunct.holds(s) for conjunct in GENERAL])


def inductive(s: Sys) -> Bool:
    """The invariant of a committed state."""
    return z3.And([conjunct.holds(s) for conjunct in CONJUNCTS])


def pool_invariant(s: Sys) -> Bool:
    """The pool-only invariant."""
    return z3.And([conjunct.holds(s) for conjunct in POOL])


def counting_facts(s: Sys) -> Bool:
    """What any true owner count satisfies: a mapped or listed page is counted at least once."""
    r, k, e, i = bound("r k e i")
    return z3.And(
        z3.ForAll([r, k], z3.Implies(s.table[r][k] != NONE, s.tcnt[s.table[r][k]] >= 1)),
        z3.ForAll([e, i], z3.Implies(between(0, i, s.elen[e]), s.scnt[s.ent[e][i]] >= 1)),
    )
