"""Deliberately broken encodings: each proof must be able to fail.

Every entry of `CORPUS` overrides one method of the faithful `Encoding` with a known bug and
names the transition whose obligations must then be refuted, and the invariant conjunct (or
extra goal) the counterexample violates. Together they cover every transition that
obligations.py proves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from kvsched.proofs.model import NONE, Arr, Bool, Int, Sys, between, bound, bump, in_pages, pick
from kvsched.proofs.transitions import Encoding, Step


class AllocateLeavesPageFree(Encoding):
    """allocate pops the stack but the page keeps its free-stack position."""

    def allocate(self, s: Sys) -> tuple[Bool, Sys, Int]:
        ok, post, page = super().allocate(s)
        return ok, post.with_(pos=s.pos), page


class RetainFreePage(Encoding):
    """retain takes a reference on a free page (no zero check)."""

    def retain(self, s: Sys, page: Any) -> Step:
        ok = z3.And(in_pages(s, page), s.refs[page] < s.max_refs)
        return ok, s.with_(refs=bump(s.refs, page, 1))


class ReleaseSkipsPush(Encoding):
    """release drops the last reference but never puts the page back on the free stack."""

    def release(self, s: Sys, page: Any) -> Step:
        ok, post = super().release(s, page)
        return ok, post.with_(stack=s.stack, top=s.top, pos=s.pos, held=s.held)


class CopyForgetsToPop(Encoding):
    """writable's copy takes the top free page without popping it."""

    def writable(self, s: Sys, current: Any) -> tuple[Bool, Sys, Int]:
        ok, post, page = super().writable(s, current)
        copying = z3.And(current != NONE, s.refs[current] > 1)
        kept = post.with_(stack=s.stack, top=s.top, pos=s.pos, held=s.held)
        return ok, pick(copying, kept, post), page


class AllocateWithoutOwner(Encoding):
    """A producer's allocation is never recorded as its hold."""

    def ext_allocate(self, s: Sys) -> tuple[Bool, Sys, Int]:
        return self.allocate(s)


class RetainPastMaximum(Encoding):
    """A producer's retain skips the ReferenceOverflow check."""

    def ext_retain(self, s: Sys, page: Any) -> Step:
        ok = z3.And(in_pages(s, page), s.refs[page] != 0)
        post = s.with_(refs=bump(s.refs, page, 1), ext=bump(s.ext, page, 1))
        return ok, post


class ReleaseSkipsDecrement(Encoding):
    """A producer's release forgets its hold but the pool keeps the reference."""

    def ext_release(self, s: Sys, page: Any) -> Step:
        ok, _ = self.release(s, page)
        return z3.And(s.ext[page] >= 1, ok), s.with_(ext=bump(s.ext, page, -1))


class ReleaseSourceFirst(Encoding):
    """Copy-on-write releases the source before allocating the copy, and keeps that release
    when the pool turns out to be exhausted."""

    def ensure_writable(self, s: Sys, slot: Any, request_id: Any, logical: Any) -> tuple[Bool, Sys, Int]:
        ok, post, page = super().ensure_writable(s, slot, request_id, logical)
        current = s.table[slot][logical]
        shared = z3.And(current != NONE, s.refs[current] > 1)
        _, released = self.release(s, current)
        exhausted = z3.And(self.found(s, slot, request_id), between(0, logical, s.width), shared, s.top == 0)
        return z3.Or(ok, exhausted), pick(exhausted, released, post), page


class WriteSharedInPlace(Encoding):
    """ensure_writable hands out a shared page for writing (no copy-on-write)."""

    def ensure_writable(self, s: Sys, slot: Any, request_id: Any, logical: Any) -> tuple[Bool, Sys, Int]:
        ok, post, page = super().ensure_writable(s, slot, request_id, logical)
        current = s.table[slot][logical]
        shared = z3.And(current != NONE, s.refs[current] > 1)
        return ok, pick(shared, s, post), z3.If(shared, current, page)


class AdmitDuplicate(Encoding):
    """admit skips the duplicate-request check."""

    def admit_miss(self, s: Sys, slot: Any, request_id: Any) -> Step:
        _, post = super().admit_miss(s, slot, request_id)
        return z3.And(z3.And(request_id >= 0, request_id <= 2**64 - 1), self.lowest_empty(s, slot)), post


class CompleteAnySlot(Encoding):
    """mark_prefill_complete does not look the request up: any slot becomes DECODE."""

    def mark_prefill_complete(self, s: Sys, slot: Any, request_id: Any) -> Step:
        return between(0, slot, s.requests), s.with_(phase=z3.Store(s.phase, slot, 2))


class SeedAnyToken(Encoding):
    """seed_decode_token accepts a token id outside u32."""

    def seed_decode_token(self, s: Sys, slot: Any, request_id: Any, token: Any) -> Step:
        _, post = super().seed_decode_token(s, slot, request_id, token)
        return self.found(s, slot, request_id), post


class RecordWithoutSaturation(Encoding):
    """record_token counts past 2**32 - 1."""

    def record_token(self, s: Sys, slot: Any, request_id: Any) -> Step:
        tokens = z3.Store(s.tokens, slot, s.tokens[slot] + 1)
        return self.found(s, slot, request_id), s.with_(tokens=tokens)


class RoundAdvancesEverySlot(Encoding):
    """A committed decode round also counts a token in empty slots."""

    def decode_round(self, s: Sys, commit: Any, outputs: Arr) -> Step:
        ok, post = super().decode_round(s, commit, outputs)
        (r,) = bound("r")
        return ok, post.with_(tokens=z3.Lambda([r], s.tokens[r] + 1))


class InitialMissesPageZero(Encoding):
    """A fresh pool whose free stack forgot page 0."""

    def initial(self, dimensions: Sys) -> Sys:
        post = super().initial(dimensions)
        return post.with_(top=post.top - 1, stack=z3.Store(post.stack, post.top - 1, NONE))


class RetainStepUncounted(Encoding):
    """A list retain takes the pool reference but records no owner for it."""

    def retain_pending(self, s: Sys, page: Any, holes: bool) -> Step:
        ok, post = super().retain_pending(s, page, holes)
        return ok, post.with_(pend=s.pend)


class SkipRollback(Encoding):
    """install_shared_prefix commits the retains it made before one failed."""

    def on_failure(self, before: Sys, partial: Sys) -> Sys:
        return partial.with_(pend=z3.K(z3.IntSort(), z3.IntVal(0)))


class ReleaseStepKeepsReference(Encoding):
    """A list release forgets the in-flight hold but the pool keeps the reference."""

    def release_pending(self, s: Sys, page: Any, holes: bool) -> Step:
        ok, _ = super().release_pending(s, page, holes)
        skip = z3.BoolVal(False) if not holes else page == NONE
        return ok, pick(skip, s, s.with_(pend=bump(s.pend, page, -1)))


class HitCountsNoTokens(Encoding):
    """A prefix hit records its prefix tokens but not the token count."""

    def commit_admit_hit(self, s: Sys, slot: Any, request_id: Any, entry: Any) -> Sys:
        post = super().commit_admit_hit(s, slot, request_id, entry)
        return post.with_(tokens=z3.Store(post.tokens, slot, 0))


class ForkKeepsParentId(Encoding):
    """fork_into admits the child under the parent's request id."""

    def commit_fork(self, s: Sys, parent: Any, child: Any, child_id: Any) -> Sys:
        post = super().commit_fork(s, parent, child, child_id)
        return post.with_(rid=z3.Store(post.rid, child, s.rid[parent]))


class FinishLeaksPages(Encoding):
    """finish clears the table without releasing its pages."""

    def detach_slot(self, s: Sys, slot: Any) -> Sys:
        post = super().detach_slot(s, slot)
        return post.with_(pend=s.pend)


class PublishKeepsReplaced(Encoding):
    """publish replaces an entry but never releases the replaced set."""

    def make_visible(
        self, s: Sys, entry: Any, identity: Any, pages: Arr, pages_pos: Arr, length: Any, tokens: Any, victim: Any
    ) -> Sys:
        post = super().make_visible(s, entry, identity, pages, pages_pos, length, tokens, victim)
        (p,) = bound("p")
        return post.with_(pend=z3.Lambda([p], s.pend[p] - z3.If(pages_pos[p] != NONE, 1, 0)))


class EvictWithoutRelease(Encoding):
    """remove and reclaim empty the entry without releasing its pages."""

    def detach_entry(self, s: Sys, entry: Any) -> Sys:
        post = super().detach_entry(s, entry)
        return post.with_(pend=s.pend)


class FifoAllocate(Encoding):
    """allocate hands out the bottom of the free stack (first-in-first-out reuse).

    Every invariant still holds, so the proofs pass: only the conformance test, which runs
    the spec, can tell that this model no longer describes it.
    """

    def allocate(self, s: Sys) -> tuple[Bool, Sys, Int]:
        (i, p) = bound("i p")
        page = s.stack[0]
        post = s.with_(
            refs=z3.Store(s.refs, page, 1),
            stack=z3.Lambda([i], z3.If(between(0, i, s.top - 1), s.stack[i + 1], NONE)),
            top=s.top - 1,
            pos=z3.Lambda([p], z3.If(s.pos[p] > 0, s.pos[p] - 1, NONE)),
            held=s.held + 1,
        )
        return s.top > 0, post, page


DRIFTED: tuple[type[Encoding], ...] = (FifoAllocate,)
"""Encodings that keep every invariant but no longer describe the spec."""


@dataclass(frozen=True)
class Broken:
    """A broken encoding, the transition it breaks, and the goal its counterexample violates."""

    encoding: type[Encoding]
    transition: str
    violates: str

    @property
    def name(self) -> str:
        """The bug's name."""
        return self.encoding.__name__

    @property
    def description(self) -> str:
        """What the bug does."""
        return " ".join((self.encoding.__doc__ or "").split())


CORPUS: tuple[Broken, ...] = (
    Broken(AllocateLeavesPageFree, "pool.allocate", "free_stack_exact"),
    Broken(RetainFreePage, "pool.retain", "free_stack_exact"),
    Broken(ReleaseSkipsPush, "pool.release", "free_stack_exact"),
    Broken(CopyForgetsToPop, "pool.writable", "free_stack_exact"),
    Broken(AllocateWithoutOwner, "ext_allocate", "refcount_equals_owners"),
    Broken(RetainPastMaximum, "ext_retain", "refcounts_bounded"),
    Broken(ReleaseSkipsDecrement, "ext_release", "refcount_equals_owners"),
    Broken(ReleaseSourceFirst, "ensure_writable", "refcount_equals_owners"),
    Broken(WriteSharedInPlace, "ensure_writable", "exclusive_write"),
    Broken(AdmitDuplicate, "admit_miss", "request_ids_unique"),
    Broken(CompleteAnySlot, "mark_prefill_complete", "request_ids_unique"),
    Broken(SeedAnyToken, "seed_decode_token", "prefix_tokens_within_count"),
    Broken(RecordWithoutSaturation, "record_token", "prefix_tokens_within_count"),
    Broken(RoundAdvancesEverySlot, "decode_round", "empty_slots_cleared"),
    Broken(InitialMissesPageZero, "initial", "free_stack_exact"),
    Broken(RetainStepUncounted, "retain_pending (sets)", "refcount_equals_owners"),
    Broken(RetainStepUncounted, "retain_pending (rows)", "refcount_equals_owners"),
    Broken(SkipRollback, "retain_pending (sets)", "refcount_equals_owners"),
    Broken(ReleaseStepKeepsReference, "release_pending (sets)", "refcount_equals_owners"),
    Broken(ReleaseStepKeepsReference, "release_pending (rows)", "refcount_equals_owners"),
    Broken(HitCountsNoTokens, "admit_hit", "prefix_tokens_within_count"),
    Broken(ForkKeepsParentId, "fork", "request_ids_unique"),
    Broken(FinishLeaksPages, "finish", "refcount_equals_owners"),
    Broken(PublishKeepsReplaced, "publish", "refcount_equals_owners"),
    Broken(EvictWithoutRelease, "remove", "refcount_equals_owners"),
    Broken(EvictWithoutRelease, "reclaim", "refcount_equals_owners"),
)


def corpus_names() -> list[str]:
    """Every broken encoding's name: the refuted ones and the drifted ones."""
    return [entry.name for entry in CORPUS] + [drifted.__name__ for drifted in DRIFTED]
