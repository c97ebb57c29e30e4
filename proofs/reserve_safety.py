"""z3 proofs for the evictable reserve (`kvsched.spec.reserve`, the pool under kvsched's vLLM
`BlockPool`): for every pool size and every key, a page the cache finds holds the content its
key names, the free queue is exactly the free pages, and the reserved page stays reserved.

The state (unbounded arrays over the integers, `pages` any size of at least one):

    refs[p]       the reference count of page p (holders; the cache holds none)
    copies[p]     how many times p is on the free queue (its order is not modelled)
    content[p]    whose KV p holds: the key of that content, or a value no key has (fresh)
    names[k][p]   the cache finds p under key k (a key may name several pages, a page carry
                  several keys)

The invariant: every page's count is non-negative and it is on the queue exactly once when its
count is 0, never otherwise (free, parked or held); page 0 is reserved (count 1, never named);
and every page a key names is a page of the pool other than 0 whose content is that key's. So
a parked page (count 0, on the queue, still named) is found only while it holds what it is
found by: its content changes only once it is taken off the queue, and taking it drops its keys.

Transitions, each `free variables p, k, c` (a page, a key, a fresh content):

    allocate  a free page is taken (count 1, off the queue); its keys are dropped (evicted)
    touch     a page gains a holder; a free one leaves the queue (a hit revives it)
    free      a holder lets go; at 0 the page goes on the queue, named or not (parked)
    register  a held page is found under the key of the content it holds
    forget    a page's keys are dropped (wherever it is)
    reset     every key is dropped, allowed only when no page but the reserved one is held
    write     the only holder of a page no key names writes it (`is_block_writable`)

Each is proved to keep the invariant (`unsat` of its negation at every size) and shown enabled.
The broken forms are refuted with a counterexample at a bounded size: allocation that keeps a
page's keys (nano-vllm's #163: a hit on a page rewritten for other content), a write to a named
page, a free that leaves a page off the queue, a revival that leaves it on, a register under a
key the page's content is not, and a touch of the reserved page that counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import z3

from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every
from kvsched.spec.reserve import (
    ReserveState,
    inv_counts_non_negative,
    inv_queue_is_the_free_pages,
    inv_reserved_held_once,
)

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)
BOUND = 3  # bounded checks: 3 pages (page 0 reserved), keys 0..3
RESERVED = 0


@dataclass(frozen=True)
class ReserveModel:
    """One state of the reserve."""

    pages: Int
    refs: Arr
    copies: Arr
    content: Arr
    names: z3.ArrayRef  # key -> page -> bool


def state(name: str) -> ReserveModel:
    def array(field: str) -> Arr:
        return z3.Array(f"{name}.{field}", z3.IntSort(), z3.IntSort())

    names = z3.Array(f"{name}.names", z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort()))
    return ReserveModel(z3.Int(f"{name}.pages"), array("refs"), array("copies"), array("content"), names)


def _in_pool(x: ReserveModel, p: Int) -> Bool:
    return z3.And(p >= 0, p < x.pages)


def invariant(x: ReserveModel, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size, every key), or over `BOUND` pages and keys."""

    def page_rule(p: Int) -> Bool:
        queued = z3.If(x.refs[p] == 0, x.copies[p] == 1, x.copies[p] == 0)
        return z3.Implies(_in_pool(x, p), z3.And(x.refs[p] >= 0, queued))

    def key_rule(k: Int) -> Bool:
        def named(p: Int) -> Bool:
            return z3.Implies(x.names[k][p], z3.And(_in_pool(x, p), p != RESERVED, x.content[p] == k))

        return every(named, f"page.{k}", range(BOUND), bounded)

    reserved = z3.And(x.pages >= 1, x.refs[RESERVED] == 1, x.copies[RESERVED] == 0)
    size = x.pages == BOUND if bounded else x.pages >= 1
    return z3.And(
        size, reserved, every(page_rule, "p", range(BOUND), bounded), every(key_rule, "k", range(BOUND + 1), bounded)
    )


def _same(x: ReserveModel, y: ReserveModel, *changed: str) -> Bool:
    fields = ("pages", "refs", "copies", "content", "names")
    return z3.And(*(getattr(y, name) == getattr(x, name) for name in fields if name not in changed))


def _without_page(x: ReserveModel, p: Int) -> z3.ArrayRef:
    """`names` with every key of page p dropped."""
    k, q = z3.Ints("drop.k drop.q")
    return z3.Lambda([k], z3.Lambda([q], z3.And(x.names[k][q], q != p)))


def allocate(x: ReserveModel, y: ReserveModel, p: Int, c: Int, *, evict: bool = True) -> Bool:
    """A free page is taken for fresh content `c`; its keys leave with its old content."""
    return z3.And(
        _in_pool(x, p),
        x.copies[p] >= 1,
        y.refs == z3.Store(x.refs, p, 1),
        y.copies == z3.Store(x.copies, p, x.copies[p] - 1),
        y.content == z3.Store(x.content, p, c),
        y.names == (_without_page(x, p) if evict else x.names),
        _same(x, y, "refs", "copies", "content", "names"),
    )


def touch(x: ReserveModel, y: ReserveModel, p: Int, *, revive: bool = True, skip_reserved: bool = True) -> Bool:
    """One more holder of p; a free p leaves the queue. The reserved page stays as it is."""
    counted = z3.And(
        y.refs == z3.Store(x.refs, p, x.refs[p] + 1),
        y.copies == (z3.Store(x.copies, p, z3.If(x.refs[p] == 0, 0, x.copies[p])) if revive else x.copies),
        _same(x, y, "refs", "copies"),
    )
    if not skip_reserved:
        return z3.And(_in_pool(x, p), counted)
    return z3.And(_in_pool(x, p), z3.If(p == RESERVED, _same(x, y), counted))


def free(x: ReserveModel, y: ReserveModel, p: Int, *, queue_it: bool = True) -> Bool:
    """A holder lets go of p (not the reserved page); at 0 it goes on the queue, keys kept."""
    count = x.refs[p] - 1
    return z3.And(
        _in_pool(x, p),
        p != RESERVED,
        x.refs[p] > 0,
        y.refs == z3.Store(x.refs, p, count),
        y.copies == (z3.Store(x.copies, p, x.copies[p] + z3.If(count == 0, 1, 0)) if queue_it else x.copies),
        _same(x, y, "refs", "copies"),
    )


def register(x: ReserveModel, y: ReserveModel, p: Int, k: Int, *, its_content: bool = True) -> Bool:
    """Held page p (not the reserved one) is found under k, the key of the content it holds
    (`its_content` False: the broken form that registers a held page under any key)."""
    guard = [_in_pool(x, p), p != RESERVED, x.refs[p] > 0]
    guard += [x.content[p] == k] if its_content else []
    return z3.And(
        *guard,
        y.names == z3.Store(x.names, k, z3.Store(x.names[k], p, True)),
        _same(x, y, "names"),
    )


def forget(x: ReserveModel, y: ReserveModel, p: Int) -> Bool:
    """Every key of p is dropped; p stays where it is."""
    return z3.And(_in_pool(x, p), y.names == _without_page(x, p), _same(x, y, "names"))


def reset(x: ReserveModel, y: ReserveModel) -> Bool:
    """Every key is dropped, when no page but the reserved one is held."""
    q = z3.Int("reset.q")
    k, r = z3.Ints("reset.k reset.r")
    idle = z3.ForAll([q], z3.Implies(z3.And(_in_pool(x, q), q != RESERVED), x.refs[q] == 0))
    return z3.And(idle, y.names == z3.Lambda([k], z3.Lambda([r], z3.BoolVal(False))), _same(x, y, "names"))


def write(x: ReserveModel, y: ReserveModel, p: Int, c: Int, *, unnamed: bool = True) -> Bool:
    """The only holder of p, which no key names, writes content `c` into it."""
    k = z3.Int("write.k")
    guard = [_in_pool(x, p), p != RESERVED, x.refs[p] == 1]
    if unnamed:
        guard.append(z3.ForAll([k], z3.Not(x.names[k][p])))
    return z3.And(*guard, y.content == z3.Store(x.content, p, c), _same(x, y, "content"))


Transition = Callable[[ReserveModel, ReserveModel], Bool]


def transitions() -> dict[str, Transition]:
    """Every transition of the reserve (page, key and content free variables)."""
    p, k, c = z3.Ints("p k c")
    return {
        "allocate": lambda x, y: allocate(x, y, p, c),
        "touch": lambda x, y: touch(x, y, p),
        "free": lambda x, y: free(x, y, p),
        "register": lambda x, y: register(x, y, p, k),
        "forget": lambda x, y: forget(x, y, p),
        "reset": reset,
        "write": lambda x, y: write(x, y, p, c),
    }


def broken() -> dict[str, Transition]:
    """The broken forms that must be refuted."""
    p, k, c = z3.Ints("p k c")
    return {
        "allocate_keeps_keys": lambda x, y: allocate(x, y, p, c, evict=False),
        "write_a_named_page": lambda x, y: write(x, y, p, c, unnamed=False),
        "free_leaves_it_off_the_queue": lambda x, y: free(x, y, p, queue_it=False),
        "revive_leaves_it_queued": lambda x, y: touch(x, y, p, revive=False),
        "register_other_content": lambda x, y: register(x, y, p, k, its_content=False),
        "touch_counts_the_reserved": lambda x, y: touch(x, y, p, skip_reserved=False),
    }


def _within_bound() -> Bool:
    p, k, c = z3.Ints("p k c")
    return z3.And(p >= 0, p < BOUND, k >= 0, k <= BOUND, c >= 0, c <= BOUND + 1)


# -- the model tied to the spec's invariants -------------------------------------------------


def encode(concrete: ReserveState, keys: Sequence[Hashable]) -> ReserveModel:
    """A concrete reserve as a ground model state: `keys[k]` is key number k, and a page holds the
    content of the key it is registered under (any page no key names holds content no key has).
    Ground for any state, corrupted or not: a page twice on the queue has 2 copies."""
    number = {key: index for index, key in enumerate(keys)}
    refs = copies = content = z3.K(z3.IntSort(), z3.IntVal(0))
    names = z3.K(z3.IntSort(), z3.K(z3.IntSort(), z3.BoolVal(False)))
    for page, count in enumerate(concrete.refs):
        refs = z3.Store(refs, page, count)
        copies = z3.Store(copies, page, concrete.queue.count(page))
        content = z3.Store(content, page, -1 - page)
    for key, page in concrete.entries:
        content = z3.Store(content, page, number[key])
        names = z3.Store(names, number[key], z3.Store(names[number[key]], page, True))
    return ReserveModel(z3.IntVal(len(concrete.refs)), refs, copies, content, names)


CARRIED = (inv_queue_is_the_free_pages, inv_reserved_held_once, inv_counts_non_negative)
"""The spec invariants the model's invariant carries. Not `inv_entries_distinct`: the model's
registrations are a set (a registration made twice is one), so a repeated one is invisible."""


def holds(concrete: ReserveState, keys: Sequence[Hashable]) -> bool:
    """The model's invariant (every size, every key) on the encoded state, decided by z3 within
    its resource units (never a clock)."""
    solver = z3.Solver()
    solver.set("rlimit", RESOURCE_LIMIT)
    solver.add(z3.Not(invariant(encode(concrete, keys))))
    verdict = solver.check()
    if verdict == z3.unknown:
        raise RuntimeError(f"z3 could not decide the reserve invariant on {concrete}: {solver.reason_unknown()}")
    return bool(verdict == z3.unsat)


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


def main() -> int:
    """Prove every transition, refute every broken form; 0 when all is as it must be."""
    return 0 if MODEL.report("reserve", 28, transitions(), broken()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
