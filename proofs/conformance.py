"""The model tied to the code: does the z3 transition relation hold for a concrete spec step?

`relation(enc, event, before, after)` is the z3 formula "the model, run from the encoding of
`before` with the event's arguments, reaches the encoding of `after`". For a concrete
state the sizes are known, so the model's choices (which slot, which entry) become a finite
disjunction and its multi-page loops unroll to the list's capacity; the composition is the same
one the proofs use (retain steps, commit; detach, release steps). A failed step of the spec
leaves the state unchanged, which the relation allows exactly when no choice of the model
succeeds. `conforms` asks z3 whether the relation is satisfiable: a model that drifted from the
spec (a different page popped, a missing decrement, a ghost count not updated) makes it false.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import product

import z3

from kvsched.proofs.encode import array, encode, identity_value
from kvsched.proofs.inductive import bounded_solver
from kvsched.proofs.model import DECODE, INT_ARRAY, NONE, Arr, Bool, Int, Sys, pick, same
from kvsched.proofs.operations import Bounds
from kvsched.proofs.transitions import Encoding
from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.spec.system import SystemState

Branch = tuple[Bool, Sys]


def _choose(branches: list[Branch], before: Sys, after: Sys) -> Bool:
    """One succeeding branch reaches `after`, or none succeeds and nothing changed."""
    reached = [z3.And(ok, same(post, after)) for ok, post in branches]
    none = z3.Not(z3.Or([ok for ok, _ in branches])) if branches else z3.BoolVal(True)
    return z3.Or(*reached, z3.And(none, same(before, after)))


def _unrolled(
    step: Callable[[Sys, Int, bool], Branch], s: Sys, items: Arr, length: Int, bound: int, holes: bool
) -> Branch:
    """`step` on each of the first `length` items, unrolled to `bound` list positions."""
    ok: Bool = z3.BoolVal(True)
    for i in range(bound):
        ok_i, after = step(s, items[i], holes)
        ok = z3.And(ok, z3.Or(i >= length, ok_i))
        s = pick(i < length, after, s)
    return ok, s


def retain_all(enc: Encoding, s: Sys, items: Arr, length: Int, bound: int, holes: bool) -> Branch:
    """The retain loop of install, fork and publish."""
    return _unrolled(enc.retain_pending, s, items, length, bound, holes)


def release_all(enc: Encoding, s: Sys, items: Arr, length: Int, bound: int, holes: bool) -> Branch:
    """The release loop of finish, remove, reclaim and a replacing publish."""
    return _unrolled(enc.release_pending, s, items, length, bound, holes)


def _evict(enc: Encoding, s: Sys, entry: int, capacity: int) -> Branch:
    detached = enc.detach_entry(s, entry)
    return release_all(enc, detached, s.ent[entry], s.elen[entry], capacity, holes=False)


def _branches(enc: Encoding, event: Event, s: Sys, bounds: Bounds) -> Iterator[Branch]:
    slots, entries, width, capacity = (
        range(bounds.requests),
        range(bounds.entries),
        bounds.logical_pages,
        bounds.entry_pages,
    )
    if isinstance(event, ev.Admit):
        for r in slots:
            ok, post = enc.admit_miss(s, r, event.request_id)
            if event.prefix is None:
                yield ok, post
                continue
            ident = identity_value(event.prefix)
            yield z3.And(ok, enc.entry_absent(s, ident)), post
            for e in entries:
                guard = enc.admit_hit_guard(s, r, event.request_id, e, ident)
                ok, retained = retain_all(enc, s, s.ent[e], s.elen[e], capacity, holes=False)
                yield z3.And(guard, ok), enc.commit_admit_hit(retained, r, event.request_id, e)
    elif isinstance(event, ev.Fork):
        for parent, child in product(slots, slots):
            guard = enc.fork_guard(s, parent, event.parent, child, event.child)
            ok, retained = retain_all(enc, s, s.table[parent], z3.IntVal(width), width, holes=True)
            yield z3.And(guard, ok), enc.commit_fork(retained, parent, child, event.child)
    elif isinstance(event, ev.EnsureWritable):
        for r in slots:
            ok, post, _ = enc.ensure_writable(s, r, event.request_id, event.logical_page)
            yield ok, post
    elif isinstance(event, ev.EnsureWritableBatch):
        steps = list(zip(event.request_ids, event.logical_pages, strict=False))
        yield _batch(enc, s, steps, bounds, len(event.request_ids) == len(event.logical_pages))
    elif isinstance(event, ev.PrepareDecodeRound):
        yield _prepare(enc, s, event.page_size, bounds)
    elif isinstance(event, ev.Finish):
        for r in slots:
            detached = enc.detach_slot(s, r)
            ok, post = release_all(enc, detached, s.table[r], z3.IntVal(width), width, holes=True)
            yield z3.And(enc.found(s, r, event.request_id), ok), post
    elif isinstance(event, ev.MarkPrefillComplete):
        for r in slots:
            yield enc.mark_prefill_complete(s, r, event.request_id)
    elif isinstance(event, ev.SeedDecodeToken):
        for r in slots:
            yield enc.seed_decode_token(s, r, event.request_id, event.token)
    elif isinstance(event, ev.RecordToken):
        for r in slots:
            yield enc.record_token(s, r, event.request_id)
    elif isinstance(event, ev.RecordTokens):  # `count` record_tokens in one step (saturating)
        for r in slots:
            ok, post = enc.found(s, r, event.request_id), s
            for _ in range(event.count):
                _, post = enc.record_token(post, r, event.request_id)
            yield z3.And(ok, event.count >= 0), post
    elif isinstance(event, ev.DecodeRound):
        yield enc.decode_round(s, z3.Bool("backend_answered"), z3.Const("outputs", INT_ARRAY))
    elif isinstance(event, ev.Publish):
        ident, pages, tokens = identity_value(event.identity), event.pages, event.tokens
        items = array(enumerate(pages), NONE)
        positions = array(((page, i) for i, page in enumerate(pages)), NONE)
        ok, retained = retain_all(enc, s, items, z3.IntVal(len(pages)), len(pages), holes=False)
        for e in entries:
            chosen, victim = enc.publish_slot(retained, e, ident)
            visible = enc.make_visible(retained, e, ident, items, positions, len(pages), tokens, victim)
            ok_release, post = release_all(enc, visible, retained.ent[e], retained.elen[e], capacity, holes=False)
            yield z3.And(enc.publish_guard(s, len(pages)), ok, chosen, ok_release), post
    elif isinstance(event, ev.Remove):
        ident = identity_value(event.identity)
        for e in entries:
            ok, post = _evict(enc, s, e, capacity)
            yield z3.And(enc.entry_found(s, e, ident), ok), post
    elif isinstance(event, ev.Reclaim):
        yield z3.BoolVal(event.pages >= 0), _reclaim(enc, s, event.pages, bounds)
    elif isinstance(event, ev.ForeignPool | ev.DecodeOverlapping):
        return  # no branch: the model never lets a foreign pool or aliased buffers change the state
    elif isinstance(event, ev.Allocate):
        ok, post, _ = enc.ext_allocate(s)
        yield ok, post
    elif isinstance(event, ev.Retain):
        yield enc.ext_retain(s, event.page)
    elif isinstance(event, ev.Release):
        yield enc.ext_release(s, event.page)
    else:
        raise ValueError(f"no model for event {event!r}")


def _ensure_any(enc: Encoding, s: Sys, request_id: int | Int, logical: int | Int, bounds: Bounds) -> Branch:
    """ensure_writable on whichever slot holds the request."""
    ok: Bool = z3.BoolVal(False)
    post = s
    for r in reversed(range(bounds.requests)):
        ok_r, post_r, _ = enc.ensure_writable(s, r, request_id, logical)
        ok, post = z3.Or(ok, ok_r), pick(ok_r, post_r, post)
    return ok, post


def _batch(enc: Encoding, s: Sys, steps: list[tuple[int, int]], bounds: Bounds, same_length: bool) -> Branch:
    """ensure_writable_batch: the single calls in order, all or nothing."""
    ok: Bool = z3.BoolVal(same_length)
    for request_id, logical in steps:
        ok_step, s = _ensure_any(enc, s, request_id, logical, bounds)
        ok = z3.And(ok, ok_step)
    return ok, s


def _prepare(enc: Encoding, s: Sys, page_size: int, bounds: Bounds) -> Branch:
    """prepare_decode_round: each DECODE slot's next token page, in slot order, all or nothing."""
    ok: Bool = z3.BoolVal(1 <= page_size <= 2**32 - 1)
    if page_size < 1:
        return ok, s
    current = s
    for r in range(bounds.requests):
        decoding = s.phase[r] == DECODE
        ok_r, post, _ = enc.ensure_writable(current, r, s.rid[r], s.tokens[r] / page_size)
        ok = z3.And(ok, z3.Or(z3.Not(decoding), ok_r))
        current = pick(decoding, post, current)
    return ok, current


def _reclaim(enc: Encoding, s: Sys, target: int, bounds: Bounds) -> Sys:
    """reclaim's loop, unrolled: each iteration evicts the LRU idle entry, or stops."""
    for _ in range(bounds.entries):
        after = s
        for e in reversed(range(bounds.entries)):
            _, evicted = _evict(enc, s, e, bounds.entry_pages)
            after = pick(enc.reclaim_victim(s, target, e), evicted, after)
        s = after
    return s


def relation(enc: Encoding, event: Event, before: SystemState, after: SystemState, bounds: Bounds) -> Bool:
    """The model relates the encodings of `before` and `after` under `event`."""
    s, t = encode(before), encode(after)
    return _choose(list(_branches(enc, event, s, bounds)), s, t)


def conforms(enc: Encoding, event: Event, before: SystemState, after: SystemState, bounds: Bounds) -> bool:
    """The spec's step from `before` to `after` is one the model allows."""
    solver = bounded_solver()
    solver.add(relation(enc, event, before, after, bounds))
    answer = solver.check()
    if answer == z3.unknown:
        raise RuntimeError(f"z3 could not decide conformance of {event!r}: {solver.reason_unknown()}")
    return bool(answer == z3.sat)
