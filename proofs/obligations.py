"""The proof obligations: for every transition, what must follow from what.

Each `Obligation` says "invariant(pre) and counting facts(pre) and the step succeeds =>
invariant(post)", with one goal per named conjunct (invariant.py), for a pre-state drawn from a
`Universe` (every size, or one small size for counterexamples).

Multi-page transitions are proved by induction over the page list:
- base: a committed state has nothing in flight, so `pend = [list[0..0)]`;
- one-step lemmas for a symbolic index `i` of an unbounded list: `retain_pending` keeps
  `pend = [list[0..i)]`, `release_pending` keeps `pend = [list[i..k)]` and cannot fail;
- the commit or detach step that turns in-flight references into an owner's, or back;
- all-or-nothing composition: a retain that fails at any `i` leaves the pre-state (`rollback`),
  and a release loop run to `k` leaves nothing in flight (`release_end`).
Together they cover install_shared_prefix (admit with a hit, i.e. attach), fork_into,
release_all (finish), publish, remove and reclaim (each iteration of its loop is one eviction).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import z3

from kvsched.proofs.invariant import (
    CONJUNCTS,
    GENERAL,
    POOL,
    Conjunct,
    counting_facts,
    general,
    inductive,
    pool_invariant,
)
from kvsched.proofs.model import NONE, U32_MAX, Arr, Bool, Int, Sys, between, bound
from kvsched.proofs.transitions import Encoding
from kvsched.proofs.universe import UNBOUNDED, Universe

Goal = tuple[str, Bool]

COVERS = {
    "pool.allocate": "BlockPool.allocate",
    "pool.retain": "BlockPool.retain",
    "pool.release": "BlockPool.release",
    "pool.writable": "BlockPool.writable (copy-on-write)",
    "ext_allocate": "allocate by an external holder",
    "ext_retain": "retain by an external holder",
    "ext_release": "release by an external holder",
    "ensure_writable": "ensure_writable (and each step of ensure_writable_batch, prepare_decode_round)",
    "admit_miss": "admit with no prefix or a miss",
    "mark_prefill_complete": "mark_prefill_complete",
    "seed_decode_token": "seed_decode_token",
    "record_token": "record_token",
    "decode_round": "execute_decode_round (commit or no change)",
    "initial": "the initial state",
    "retain_pending (sets)": "retain step of install_shared_prefix and publish, and their rollback",
    "retain_pending (rows)": "retain step of fork_into, and its rollback",
    "release_pending (sets)": "release step of remove, reclaim and a replacing publish",
    "release_pending (rows)": "release step of release_all (finish)",
    "admit_hit": "admit with a hit: attach, install_shared_prefix's commit",
    "fork": "fork_into's commit",
    "finish": "finish = release_all's detach",
    "publish": "publish's make-visible step",
    "remove": "remove's detach",
    "reclaim": "each eviction of reclaim's loop",
}
"""What each proved transition (a key of the report) stands for in the spec."""


@dataclass(frozen=True)
class Obligation:
    """Hypotheses about `pre` and the goals that must follow, for one step of one transition."""

    transition: str
    step: str
    pre: Sys
    hypotheses: tuple[Bool, ...]
    goals: tuple[Goal, ...]


def goals_of(conjuncts: Iterable[Conjunct], post: Sys) -> tuple[Goal, ...]:
    """One goal per conjunct, about `post`."""
    return tuple((conjunct.name, conjunct.holds(post)) for conjunct in conjuncts)


def list_well_formed(items: Arr, positions: Arr, length: Int, holes: bool) -> Bool:
    """`positions` inverts the first `length` items (distinct pages; NONE entries if `holes`)."""
    j, p = bound("j p")
    in_list = z3.Or(items[j] == NONE, positions[items[j]] == j) if holes else positions[items[j]] == j
    parts = [
        length >= 0,
        z3.ForAll([j], z3.If(between(0, j, length), in_list, items[j] == NONE)),
        z3.ForAll(
            [p],
            z3.Implies(positions[p] != NONE, z3.And(between(0, positions[p], length), items[positions[p]] == p)),
        ),
    ]
    if holes:
        parts.append(positions[NONE] == NONE)
    return z3.And(parts)


def retained_so_far(s: Sys, positions: Arr, index: Int) -> Bool:
    """Retain-loop invariant: exactly the list's first `index` pages are in flight."""
    (p,) = bound("p")
    return z3.ForAll([p], s.pend[p] == z3.If(between(0, positions[p], index), 1, 0))


def still_to_release(s: Sys, positions: Arr, index: Int, length: Int) -> Bool:
    """Release-loop invariant: exactly the list's pages from `index` on are in flight."""
    (p,) = bound("p")
    return z3.ForAll([p], s.pend[p] == z3.If(z3.And(index <= positions[p], positions[p] < length), 1, 0))


def _committed(s: Sys, u: Universe) -> tuple[Bool, ...]:
    return (inductive(s), counting_facts(s), u.exact(s))


def _in_flight(s: Sys, u: Universe) -> tuple[Bool, ...]:
    return (general(s), counting_facts(s), u.exact(s))


def pool_obligations(enc: Encoding, u: Universe) -> list[Obligation]:
    """allocate, retain, release and writable keep the pool's own invariant."""
    s = u.state("s")
    page = z3.Int("page")
    ok_a, allocated, _ = enc.allocate(s)
    ok_t, retained = enc.retain(s, page)
    ok_r, released = enc.release(s, page)
    ok_w, written, _ = enc.writable(s, page)
    base = (pool_invariant(s),)
    return [
        Obligation("pool.allocate", "step", s, (*base, ok_a), goals_of(POOL, allocated)),
        Obligation("pool.retain", "step", s, (*base, ok_t), goals_of(POOL, retained)),
        Obligation("pool.release", "step", s, (*base, ok_r), goals_of(POOL, released)),
        Obligation("pool.writable", "step", s, (*base, ok_w), goals_of(POOL, written)),
    ]


def single_step_obligations(enc: Encoding, u: Universe) -> list[Obligation]:
    """Transitions that touch at most two pages, and the initial state."""
    s = u.state("s")
    slot, rid, logical, page, token = z3.Ints("slot rid logical page token")
    outputs = u.array("outputs", "slots", 0)
    result: list[Obligation] = []

    def single(name: str, ok: Bool, post: Sys, extra: Sequence[Goal] = ()) -> None:
        result.append(Obligation(name, "step", s, (*_committed(s, u), ok), (*goals_of(CONJUNCTS, post), *extra)))

    single("ext_allocate", *enc.ext_allocate(s)[:2])
    single("ext_retain", *enc.ext_retain(s, page))
    single("ext_release", *enc.ext_release(s, page))
    ok_w, written, target = enc.ensure_writable(s, slot, rid, logical)
    exclusive = ("exclusive_write", written.refs[written.table[slot][logical]] == 1)
    single("ensure_writable", ok_w, written, (exclusive, ("maps_written_page", written.table[slot][logical] == target)))
    single("admit_miss", *enc.admit_miss(s, slot, rid))
    single("mark_prefill_complete", *enc.mark_prefill_complete(s, slot, rid))
    single("seed_decode_token", *enc.seed_decode_token(s, slot, rid, token))
    single("record_token", *enc.record_token(s, slot, rid))
    single("decode_round", *enc.decode_round(s, z3.Bool("commit"), outputs))
    dims = u.state("d")
    sizes = (
        dims.pages >= 0,
        dims.max_refs >= 1,
        dims.requests >= 1,
        dims.width >= 1,
        dims.entries >= 0,
        dims.capacity >= 1,
    )
    result.append(Obligation("initial", "state", dims, sizes, goals_of(CONJUNCTS, enc.initial(dims))))
    return result


def loop_obligations(enc: Encoding, u: Universe) -> list[Obligation]:
    """The one-page lemmas, for lists with holes (table rows) and without (page sets)."""
    result: list[Obligation] = []
    for holes in (False, True):
        kind = "rows" if holes else "sets"
        s, s0 = u.state("s"), u.state("s0")
        items, positions = u.array("list.items", "list", NONE), u.array("list.pos", "pages", NONE)
        length, i = z3.Int("list.length"), z3.Int("i")
        shape = (list_well_formed(items, positions, length, holes), between(0, i, length))
        ok, post = enc.retain_pending(s, items[i], holes)
        so_far = retained_so_far(s, positions, i)
        step = (*goals_of(GENERAL, post), ("loop_invariant", retained_so_far(post, positions, i + 1)))
        result.append(Obligation(f"retain_pending ({kind})", "step", s, (*_in_flight(s, u), *shape, so_far, ok), step))
        rollback = (*_committed(s0, u), *_in_flight(s, u), *shape, so_far, z3.Not(ok))
        result.append(
            Obligation(f"retain_pending ({kind})", "rollback", s, rollback, goals_of(CONJUNCTS, enc.on_failure(s0, s)))
        )
        ok, post = enc.release_pending(s, items[i], holes)
        step = (
            ("cannot_fail", ok),
            *goals_of(GENERAL, post),
            ("loop_invariant", still_to_release(post, positions, i + 1, length)),
        )
        loop = still_to_release(s, positions, i, length)
        result.append(Obligation(f"release_pending ({kind})", "step", s, (*_in_flight(s, u), *shape, loop), step))
        ends = (*_committed(s0, u), *_in_flight(s, u), length >= 0, still_to_release(s, positions, length, length))
        ends_goals = (("retain_base", retained_so_far(s0, positions, 0)), ("release_end", inductive(s)))
        result.append(Obligation(f"release_pending ({kind})", "base and end", s, ends, ends_goals))
    return result


def _release_loop_starts(detached: Sys, items: Arr, positions: Arr, length: Int, holes: bool) -> tuple[Goal, ...]:
    return (
        ("list", list_well_formed(items, positions, length, holes)),
        *goals_of(GENERAL, detached),
        ("loop_invariant", still_to_release(detached, positions, 0, length)),
    )


def multi_page_obligations(enc: Encoding, u: Universe) -> list[Obligation]:
    """The commit and detach steps around the one-page loops."""
    s = u.state("s")
    slot, rid, entry, identity, parent, parent_id, tokens, target, length = z3.Ints(
        "slot rid entry identity parent parent_id tokens target length"
    )
    result: list[Obligation] = []

    guard = enc.admit_hit_guard(s, slot, rid, entry, identity)
    entry_list = list_well_formed(s.ent[entry], s.epos[entry], s.elen[entry], holes=False)
    result.append(Obligation("admit_hit", "entry is a list", s, (*_committed(s, u), guard), (("list", entry_list),)))
    done = retained_so_far(s, s.epos[entry], s.elen[entry])
    hit = enc.commit_admit_hit(s, slot, rid, entry)
    result.append(Obligation("admit_hit", "commit", s, (*_in_flight(s, u), guard, done), goals_of(CONJUNCTS, hit)))

    guard = enc.fork_guard(s, parent, parent_id, slot, rid)
    row = list_well_formed(s.table[parent], s.tpos[parent], s.width, holes=True)
    result.append(Obligation("fork", "parent row is a list", s, (*_committed(s, u), guard), (("list", row),)))
    done = retained_so_far(s, s.tpos[parent], s.width)
    forked = enc.commit_fork(s, parent, slot, rid)
    result.append(Obligation("fork", "commit", s, (*_in_flight(s, u), guard, done), goals_of(CONJUNCTS, forked)))

    detached = enc.detach_slot(s, slot)
    starts = _release_loop_starts(detached, s.table[slot], s.tpos[slot], s.width, holes=True)
    result.append(Obligation("finish", "detach", s, (*_committed(s, u), enc.found(s, slot, rid)), starts))

    pages, pages_pos = u.array("P.items", "list", NONE), u.array("P.pos", "pages", NONE)
    chosen, victim = enc.publish_slot(s, entry, identity)
    new_set = (
        list_well_formed(pages, pages_pos, length, holes=False),
        length >= 1,
        between(1, tokens, U32_MAX + 1),
        enc.publish_guard(s, length),
        retained_so_far(s, pages_pos, length),
    )
    visible = enc.make_visible(s, entry, identity, pages, pages_pos, length, tokens, victim)
    starts = _release_loop_starts(visible, s.ent[entry], s.epos[entry], s.elen[entry], holes=False)
    result.append(Obligation("publish", "make_visible", s, (*_in_flight(s, u), *new_set, chosen), starts))

    for name, guard in (
        ("remove", enc.entry_found(s, entry, identity)),
        ("reclaim", z3.And(target >= 0, enc.reclaim_victim(s, target, entry))),
    ):
        detached = enc.detach_entry(s, entry)
        starts = _release_loop_starts(detached, s.ent[entry], s.epos[entry], s.elen[entry], holes=False)
        result.append(Obligation(name, "detach", s, (*_committed(s, u), guard), starts))
    return result


def obligations(enc: Encoding | None = None, universe: Universe = UNBOUNDED) -> list[Obligation]:
    """Every proof obligation of the model `enc` (the faithful one by default)."""
    enc = enc or Encoding()
    return [
        *pool_obligations(enc, universe),
        *single_step_obligations(enc, universe),
        *loop_obligations(enc, universe),
        *multi_page_obligations(enc, universe),
    ]
