"""The spec's transitions as z3 functions from a pre-state `Sys` to `(ok, post-state)`.

Each method mirrors one spec function, step for step (the same order of allocate, retain and
release), and returns the condition under which the spec succeeds; when it is false the spec
raises and the state is unchanged (spec objects store a new state only after the pure transition
returned). `Encoding` is the faithful model; a broken variant (broken.py) overrides one method,
and both the proofs and the conformance test are built from whichever encoding they are given.

Multi-page transitions are split into one-page steps around the in-flight counter `pend`:

    install / fork / publish:  retain_pending(list[0]) ... retain_pending(list[k-1]), then
                               commit (the retained references become the new owner's);
    finish / remove / reclaim: detach (the owner's references become in-flight), then
                               release_pending(list[0]) ... release_pending(list[k-1]);
    publish, replacing:        the retains, make_visible (new set in, old set in flight), releases.

A failing retain anywhere aborts the whole spec transition, which then changes nothing: the
all-or-nothing composition. inductive.py proves each step and the commit once, for a symbolic
index `i` of an unbounded list; conformance.py unrolls them for concrete lists.
"""

from __future__ import annotations

from typing import Any

import z3

from kvsched.proofs.model import (
    DECODE,
    EMPTY,
    NONE,
    PREFILL,
    U32_MAX,
    Arr,
    Bool,
    Int,
    Sys,
    between,
    bound,
    bump,
    empty_row,
    in_pages,
    in_slots,
    is_live,
    is_u32,
    is_u64,
    one_if,
    pick,
    set_row,
)
from kvsched.proofs.store_steps import StoreSteps

Step = tuple[Bool, Sys]


def _saturating_increment(count: Any) -> Int:
    result: Int = z3.If(count + 1 > U32_MAX, U32_MAX, count + 1)
    return result


class Encoding(StoreSteps):
    """The faithful model of spec/pool.py, table.py, prefix.py and scheduler.py."""

    name = "spec"

    # ---- the pool (spec/pool.py) --------------------------------------------------------

    def allocate(self, s: Sys) -> tuple[Bool, Sys, Int]:
        """Pop the top of the free stack with one reference."""
        page = s.stack[s.top - 1]
        post = s.with_(
            refs=z3.Store(s.refs, page, 1),
            stack=z3.Store(s.stack, s.top - 1, NONE),
            top=s.top - 1,
            pos=z3.Store(s.pos, page, NONE),
            held=s.held + 1,
        )
        return s.top > 0, post, page

    def retain(self, s: Sys, page: Any) -> Step:
        """One more reference on a held page below the maximum."""
        ok = z3.And(in_pages(s, page), s.refs[page] != 0, s.refs[page] < s.max_refs)
        return ok, s.with_(refs=bump(s.refs, page, 1))

    def release(self, s: Sys, page: Any) -> Step:
        """One reference fewer; the last one pushes the page on top of the free stack."""
        ok = z3.And(in_pages(s, page), s.refs[page] != 0)
        last = s.refs[page] == 1
        post = s.with_(
            refs=bump(s.refs, page, -1),
            stack=z3.If(last, z3.Store(s.stack, s.top, page), s.stack),
            top=z3.If(last, s.top + 1, s.top),
            pos=z3.If(last, z3.Store(s.pos, page, s.top), s.pos),
            held=z3.If(last, s.held - 1, s.held),
        )
        return ok, post

    def writable(self, s: Sys, current: Any) -> tuple[Bool, Sys, Int]:
        """Allocated when unmapped, Existing at one reference, else Copy: allocate, then release."""
        unmapped = current == NONE
        count = s.refs[current]
        ok_allocate, allocated, fresh = self.allocate(s)
        ok_release, copied = self.release(allocated, current)
        ok = z3.If(
            unmapped,
            ok_allocate,
            z3.And(in_pages(s, current), count != 0, z3.Or(count == 1, z3.And(ok_allocate, ok_release))),
        )
        post = pick(unmapped, allocated, pick(count == 1, s, copied))
        page: Int = z3.If(z3.And(z3.Not(unmapped), count == 1), current, fresh)
        return ok, post, page

    # ---- external holders (SystemState.external) ----------------------------------------

    def ext_allocate(self, s: Sys) -> tuple[Bool, Sys, Int]:
        """A producer allocates a page and holds it."""
        ok, post, page = self.allocate(s)
        return ok, post.with_(ext=bump(post.ext, page, 1)), page

    def ext_retain(self, s: Sys, page: Any) -> Step:
        """A producer takes one more reference."""
        ok, post = self.retain(s, page)
        return ok, post.with_(ext=bump(post.ext, page, 1))

    def ext_release(self, s: Sys, page: Any) -> Step:
        """A producer gives back one reference it holds."""
        ok, post = self.release(s, page)
        return z3.And(s.ext[page] >= 1, ok), post.with_(ext=bump(post.ext, page, -1))

    # ---- one-page steps of multi-page transitions ---------------------------------------

    def retain_pending(self, s: Sys, page: Any, holes: bool) -> Step:
        """Retain one page of a list into flight (an unmapped entry of a table is skipped)."""
        ok, post = self.retain(s, page)
        post = post.with_(pend=bump(s.pend, page, 1))
        if not holes:
            return ok, post
        skip = page == NONE
        return z3.Or(skip, ok), pick(skip, s, post)

    def release_pending(self, s: Sys, page: Any, holes: bool) -> Step:
        """Release one in-flight page of a list."""
        ok, post = self.release(s, page)
        post = post.with_(pend=bump(post.pend, page, -1))
        if not holes:
            return ok, post
        skip = page == NONE
        return z3.Or(skip, ok), pick(skip, s, post)

    def on_failure(self, before: Sys, partial: Sys) -> Sys:
        """A failed multi-page transition: the spec discards the partial state."""
        return before

    # ---- the request scheduler (spec/scheduler.py, table.py) ----------------------------

    def found(self, s: Sys, slot: Any, request_id: Any) -> Bool:
        """`request_id` is live in `slot`."""
        return z3.And(is_u64(request_id), is_live(s, slot), s.rid[slot] == request_id)

    def absent(self, s: Sys, request_id: Any) -> Bool:
        """`request_id` is live nowhere."""
        (r,) = bound("absent_r")
        return z3.ForAll([r], z3.Not(z3.And(is_live(s, r), s.rid[r] == request_id)))

    def lowest_empty(self, s: Sys, slot: Any) -> Bool:
        """`slot` is the lowest empty slot."""
        (r,) = bound("lower_r")
        return z3.And(
            in_slots(s, slot),
            s.phase[slot] == EMPTY,
            z3.ForAll([r], z3.Implies(between(0, r, slot), s.phase[r] != EMPTY)),
        )

    def can_admit(self, s: Sys, slot: Any, request_id: Any) -> Bool:
        """The admission checks of `admit` and `fork`: a valid new id, placed lowest."""
        return z3.And(is_u64(request_id), self.absent(s, request_id), self.lowest_empty(s, slot))

    def set_slot(self, s: Sys, slot: Any, phase: Any, request_id: Any, tokens: Any, ptok: Any) -> Sys:
        """A freshly admitted slot: no input token seeded yet."""
        return s.with_(
            phase=z3.Store(s.phase, slot, phase),
            rid=z3.Store(s.rid, slot, request_id),
            tokens=z3.Store(s.tokens, slot, tokens),
            ptok=z3.Store(s.ptok, slot, ptok),
            nexttok=z3.Store(s.nexttok, slot, 0),
            ready=z3.Store(s.ready, slot, False),
        )

    def remap(self, s: Sys, slot: Any, logical: Any, old: Any, new: Any) -> Sys:
        """Entry (slot, logical) changes from `old` to `new`; the table counts move with it."""
        tcnt = z3.If(old != NONE, bump(s.tcnt, old, -1), s.tcnt)
        tcnt = z3.If(new != NONE, bump(tcnt, new, 1), tcnt)
        row = s.tpos[slot]
        row = z3.If(old != NONE, z3.Store(row, old, NONE), row)
        row = z3.If(new != NONE, z3.Store(row, new, logical), row)
        return s.with_(table=set_row(s.table, slot, logical, new), tpos=z3.Store(s.tpos, slot, row), tcnt=tcnt)

    def ensure_writable(self, s: Sys, slot: Any, request_id: Any, logical: Any) -> tuple[Bool, Sys, Int]:
        """Make one logical page of a live request exclusively its own."""
        current = s.table[slot][logical]
        ok_write, pool_post, page = self.writable(s, current)
        remapped = self.remap(pool_post, slot, logical, current, page)
        ok = z3.And(self.found(s, slot, request_id), between(0, logical, s.width), ok_write)
        return ok, pick(page == current, pool_post, remapped), page

    def commit_install(self, s: Sys, slot: Any, row: Arr, row_pos: Arr) -> Sys:
        """The in-flight references on `row` become the table's (install and fork)."""
        (p,) = bound("p")
        member = one_if(row_pos[p] != NONE)
        return s.with_(
            table=z3.Store(s.table, slot, row),
            tpos=z3.Store(s.tpos, slot, row_pos),
            tcnt=z3.Lambda([p], s.tcnt[p] + member),
            pend=z3.Lambda([p], s.pend[p] - member),
        )

    def commit_admit_hit(self, s: Sys, slot: Any, request_id: Any, entry: Any) -> Sys:
        """Install the entry's pages, admit straight into DECODE and touch the entry."""
        tokens = s.etok[entry]
        post = self.commit_install(s, slot, s.ent[entry], s.epos[entry])
        post = self.set_slot(post, slot, DECODE, request_id, tokens, tokens)
        return post.with_(eused=z3.Store(s.eused, entry, s.clock), clock=s.clock + 1)

    def admit_miss(self, s: Sys, slot: Any, request_id: Any) -> Step:
        """Admit with no prefix (none named, or not published): PREFILL with nothing counted."""
        return self.can_admit(s, slot, request_id), self.set_slot(s, slot, PREFILL, request_id, 0, 0)

    def admit_hit_guard(self, s: Sys, slot: Any, request_id: Any, entry: Any, identity: Any) -> Bool:
        """Everything `admit` checks before retaining the prefix's pages."""
        return z3.And(
            self.can_admit(s, slot, request_id),
            self.entry_found(s, entry, identity),
            s.elen[entry] <= s.width,
        )

    def commit_fork(self, s: Sys, parent: Any, child: Any, child_id: Any) -> Sys:
        """The child shares the parent's pages and copies every other field."""
        post = self.commit_install(s, child, s.table[parent], s.tpos[parent])
        post = self.set_slot(post, child, s.phase[parent], child_id, s.tokens[parent], s.ptok[parent])
        return post.with_(
            nexttok=z3.Store(post.nexttok, child, s.nexttok[parent]),
            ready=z3.Store(post.ready, child, s.ready[parent]),
        )

    def fork_guard(self, s: Sys, parent: Any, parent_id: Any, child: Any, child_id: Any) -> Bool:
        """Everything `fork` checks before retaining the parent's pages."""
        return z3.And(self.found(s, parent, parent_id), self.can_admit(s, child, child_id))

    def detach_slot(self, s: Sys, slot: Any) -> Sys:
        """finish, first half: the slot is cleared and its pages are in flight."""
        (p,) = bound("p")
        member = one_if(s.tpos[slot][p] != NONE)
        cleared = self.set_slot(s, slot, EMPTY, 0, 0, 0)
        return cleared.with_(
            table=z3.Store(s.table, slot, empty_row()),
            tpos=z3.Store(s.tpos, slot, empty_row()),
            tcnt=z3.Lambda([p], s.tcnt[p] - member),
            pend=z3.Lambda([p], s.pend[p] + member),
        )

    def mark_prefill_complete(self, s: Sys, slot: Any, request_id: Any) -> Step:
        """PREFILL -> DECODE."""
        ok = z3.And(self.found(s, slot, request_id), s.phase[slot] == PREFILL)
        return ok, s.with_(phase=z3.Store(s.phase, slot, DECODE))

    def seed_decode_token(self, s: Sys, slot: Any, request_id: Any, token: Any) -> Step:
        """Publish the next input token."""
        ok = z3.And(self.found(s, slot, request_id), is_u32(token))
        return ok, s.with_(nexttok=z3.Store(s.nexttok, slot, token), ready=z3.Store(s.ready, slot, True))

    def record_token(self, s: Sys, slot: Any, request_id: Any) -> Step:
        """Count one token written outside a round (saturating)."""
        tokens = z3.Store(s.tokens, slot, _saturating_increment(s.tokens[slot]))
        return self.found(s, slot, request_id), s.with_(tokens=tokens)

    def decode_round(self, s: Sys, commit: Any, outputs: Arr) -> Step:
        """One round: every DECODE slot consumes its token and gets `outputs[slot]`, or none does.

        `commit` is whether the backend answered exactly (one launch, identities, batch size);
        the model does not look inside the backend, it only requires all-or-nothing.
        """
        (r,) = bound("r")
        decoding = z3.And(in_slots(s, r), s.phase[r] == DECODE)
        ok = z3.And(
            commit,
            z3.ForAll([r], z3.Implies(decoding, z3.And(s.ready[r], is_u32(outputs[r])))),
        )
        post = s.with_(
            nexttok=z3.Lambda([r], z3.If(decoding, outputs[r], s.nexttok[r])),
            tokens=z3.Lambda([r], z3.If(decoding, _saturating_increment(s.tokens[r]), s.tokens[r])),
            ready=z3.Lambda([r], z3.Or(decoding, s.ready[r])),
        )
        return ok, post

    # ---- the initial state -------------------------------------------------------------

    def initial(self, dimensions: Sys) -> Sys:
        """A fresh system of the given sizes: every page free, handing out 0 first."""
        (i,) = bound("i")
        n = dimensions.pages
        zero = z3.K(z3.IntSort(), z3.IntVal(0))
        return dimensions.with_(
            refs=zero,
            stack=z3.Lambda([i], z3.If(between(0, i, n), n - 1 - i, NONE)),
            top=n,
            pos=z3.Lambda([i], z3.If(between(0, i, n), n - 1 - i, NONE)),
            held=z3.IntVal(0),
            table=z3.K(z3.IntSort(), empty_row()),
            tpos=z3.K(z3.IntSort(), empty_row()),
            phase=z3.K(z3.IntSort(), z3.IntVal(EMPTY)),
            rid=zero,
            tokens=zero,
            ptok=zero,
            nexttok=zero,
            ready=z3.K(z3.IntSort(), z3.BoolVal(False)),
            ent=z3.K(z3.IntSort(), empty_row()),
            epos=z3.K(z3.IntSort(), empty_row()),
            elen=zero,
            eid=zero,
            etok=zero,
            eused=zero,
            victim=z3.IntVal(0),
            clock=z3.IntVal(0),
            tcnt=zero,
            scnt=zero,
            ext=zero,
            pend=zero,
        )
