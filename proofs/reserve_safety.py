"""z3 proofs for the evictable reserve (`kvsched.spec.reserve`, the pool under kvsched's vLLM
`BlockPool`): for every pool size and every key, a page the cache finds holds the content its
key names, the free queue is exactly the free pages, and the reserved page stays reserved.

The state (unbounded arrays over the integers, `pages` any size of at least one):

    refs[p]       the reference count of page p (holders; the cache holds none)
    copies[p]     how many times p is on the free queue
    rank[p]       a queued page's place on it: the lowest is taken first; every queued page's
                  rank lies in [head, tail], so a page put at the front gets head - 1 and one
                  parked at the back tail + 1
    elsewhere[p]  p was freed to the eviction end: another tier holds its content
    content[p]    whose KV p holds: the key of that content, or a value no key has (fresh)
    names[k][p]   the cache finds p under key k (a key may name several pages, a page carry
                  several keys)

The invariant: every page's count is non-negative and it is on the queue exactly once when its
count is 0, never otherwise (free, parked or held), within [head, tail]; page 0 is reserved
(count 1, never named); every page a key names is a page of the pool other than 0 whose content
is that key's. So a parked page (count 0, on the queue, still named) is found only while it holds
what it is found by: its content changes only once it is taken off the queue, and taking it
drops its keys. And the order the eviction end promises: a queued page whose content is held
elsewhere is ahead of every queued page the cache names that only this pool holds, so it is
evicted before any of them.

Transitions, each `free variables p, k, c` (a page, a key, a fresh content):

    allocate  the front page is taken (count 1, off the queue); its keys are dropped (evicted)
    touch     a page gains a holder; a free one leaves the queue (a hit revives it)
    free      a holder lets go; at 0 the page goes on the queue, named or not: a named one is
              parked at the back, one no key names goes to the front
    free_evict_first
              the same, but at 0 the page goes to the front, named or not, its content held
              elsewhere (vLLM 0.34's `free_blocks(..., evict_first=True)`)
    unpin     a holder lets go; at 0 the page goes to the back, named or not
    register  a held page is found under the key of the content it holds
    forget    a page's keys are dropped (wherever it is)
    reset     every key is dropped, allowed only when no page but the reserved one is held
    write     the only holder of a page no key names writes it (`is_block_writable`)

Each is proved to keep the invariant (`unsat` of its negation at every size) and shown enabled.
The broken forms are refuted with a counterexample at a bounded size: allocation that keeps a
page's keys (nano-vllm's #163: a hit on a page rewritten for other content), a write to a named
page, a free that leaves a page off the queue, a revival that leaves it on, a register under a
key the page's content is not, a touch of the reserved page that counts it, an eviction-end free
that parks the page at the back, and a free that puts a named page at the front.

The model is of a pool with caching on: with it off the spec frees every page to the front, and
no order is promised.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import z3

from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every, invariant_holds
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
    rank: Arr
    head: Int
    tail: Int
    elsewhere: z3.ArrayRef  # page -> bool


FIELDS = ("pages", "refs", "copies", "content", "names", "rank", "head", "tail", "elsewhere")


def state(name: str) -> ReserveModel:
    def array(field: str) -> Arr:
        return z3.Array(f"{name}.{field}", z3.IntSort(), z3.IntSort())

    names = z3.Array(f"{name}.names", z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort()))
    elsewhere = z3.Array(f"{name}.elsewhere", z3.IntSort(), z3.BoolSort())
    return ReserveModel(
        z3.Int(f"{name}.pages"),
        array("refs"),
        array("copies"),
        array("content"),
        names,
        array("rank"),
        z3.Int(f"{name}.head"),
        z3.Int(f"{name}.tail"),
        elsewhere,
    )


def _in_pool(x: ReserveModel, p: Int) -> Bool:
    return z3.And(p >= 0, p < x.pages)


def invariant(x: ReserveModel, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size, every key), or over `BOUND` pages and keys."""

    def page_rule(p: Int) -> Bool:
        queued = z3.If(
            x.refs[p] == 0, z3.And(x.copies[p] == 1, x.head <= x.rank[p], x.rank[p] <= x.tail), x.copies[p] == 0
        )
        return z3.Implies(_in_pool(x, p), z3.And(x.refs[p] >= 0, queued))

    def order_rule(p: Int) -> Bool:
        def behind(q: Int) -> Bool:
            def named_by(k: Int) -> Bool:
                only_here = z3.And(_in_pool(x, q), x.refs[q] == 0, z3.Not(x.elsewhere[q]), x.names[k][q])
                return z3.Implies(only_here, x.rank[p] < x.rank[q])

            return every(named_by, f"order.k.{p}", range(BOUND + 1), bounded)

        spent = z3.And(_in_pool(x, p), x.refs[p] == 0, x.elsewhere[p])
        return z3.Implies(spent, every(behind, f"order.q.{p}", range(BOUND), bounded))

    def key_rule(k: Int) -> Bool:
        def named(p: Int) -> Bool:
            return z3.Implies(x.names[k][p], z3.And(_in_pool(x, p), p != RESERVED, x.content[p] == k))

        return every(named, f"page.{k}", range(BOUND), bounded)

    reserved = z3.And(x.pages >= 1, x.refs[RESERVED] == 1, x.copies[RESERVED] == 0, x.head <= x.tail + 1)
    size = x.pages == BOUND if bounded else x.pages >= 1
    return z3.And(
        size,
        reserved,
        every(page_rule, "p", range(BOUND), bounded),
        every(key_rule, "k", range(BOUND + 1), bounded),
        every(order_rule, "o", range(BOUND), bounded),
    )


def _same(x: ReserveModel, y: ReserveModel, *changed: str) -> Bool:
    return z3.And(*(getattr(y, name) == getattr(x, name) for name in FIELDS if name not in changed))


def _without_page(x: ReserveModel, p: Int) -> z3.ArrayRef:
    """`names` with every key of page p dropped."""
    k, q = z3.Ints("drop.k drop.q")
    return z3.Lambda([k], z3.Lambda([q], z3.And(x.names[k][q], q != p)))


def allocate(x: ReserveModel, y: ReserveModel, p: Int, c: Int, *, evict: bool = True) -> Bool:
    """The front page is taken for fresh content `c`; its keys leave with its old content."""
    q = z3.Int("allocate.q")
    front = z3.ForAll([q], z3.Implies(z3.And(_in_pool(x, q), x.refs[q] == 0), x.rank[p] <= x.rank[q]))
    return z3.And(
        _in_pool(x, p),
        x.copies[p] >= 1,
        front,
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


def _front(x: ReserveModel, y: ReserveModel, p: Int) -> Bool:
    return z3.And(y.rank == z3.Store(x.rank, p, x.head - 1), y.head == x.head - 1, y.tail == x.tail)


def _back(x: ReserveModel, y: ReserveModel, p: Int) -> Bool:
    return z3.And(y.rank == z3.Store(x.rank, p, x.tail + 1), y.head == x.head, y.tail == x.tail + 1)


def _named(x: ReserveModel, p: Int) -> Bool:
    k = z3.Int("named.k")
    return z3.Exists([k], x.names[k][p])


Place = Callable[[ReserveModel, ReserveModel, Int], Bool]


def _release(x: ReserveModel, y: ReserveModel, p: Int, place: Place, elsewhere: bool, *, queue_it: bool = True) -> Bool:
    """A holder lets go of p (not the reserved page); at 0 it goes on the queue where `place`
    puts it, keys kept, its content held elsewhere or not."""
    count = x.refs[p] - 1
    unchanged = z3.And(y.rank == x.rank, y.head == x.head, y.tail == x.tail, y.elsewhere == x.elsewhere)
    queued = z3.And(place(x, y, p), y.elsewhere == z3.Store(x.elsewhere, p, z3.BoolVal(elsewhere)))
    return z3.And(
        _in_pool(x, p),
        p != RESERVED,
        x.refs[p] > 0,
        y.refs == z3.Store(x.refs, p, count),
        y.copies == (z3.Store(x.copies, p, x.copies[p] + z3.If(count == 0, 1, 0)) if queue_it else x.copies),
        z3.If(count == 0, queued, unchanged),
        _same(x, y, "refs", "copies", "rank", "head", "tail", "elsewhere"),
    )


def _by_its_keys(x: ReserveModel, y: ReserveModel, p: Int) -> Bool:
    return z3.If(_named(x, p), _back(x, y, p), _front(x, y, p))


def free(x: ReserveModel, y: ReserveModel, p: Int, *, queue_it: bool = True) -> Bool:
    """A holder lets go of p; at 0 a named page is parked at the back, another goes to the front."""
    return _release(x, y, p, _by_its_keys, False, queue_it=queue_it)


def free_evict_first(x: ReserveModel, y: ReserveModel, p: Int, *, place: Place = _front) -> Bool:
    """A holder lets go of p; at 0 it goes to the front, named or not, its content held elsewhere."""
    return _release(x, y, p, place, True)


def unpin(x: ReserveModel, y: ReserveModel, p: Int) -> Bool:
    """A holder lets go of p; at 0 it goes to the back, named or not."""
    return _release(x, y, p, _back, False)


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
        "free_evict_first": lambda x, y: free_evict_first(x, y, p),
        "unpin": lambda x, y: unpin(x, y, p),
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
        "evict_first_parks_at_the_back": lambda x, y: free_evict_first(x, y, p, place=_back),
        "free_puts_a_named_page_first": lambda x, y: _release(x, y, p, _front, False),
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
    refs = copies = content = rank = z3.K(z3.IntSort(), z3.IntVal(0))
    names = z3.K(z3.IntSort(), z3.K(z3.IntSort(), z3.BoolVal(False)))
    for page, count in enumerate(concrete.refs):
        refs = z3.Store(refs, page, count)
        copies = z3.Store(copies, page, concrete.queue.count(page))
        content = z3.Store(content, page, -1 - page)
    for place, page in enumerate(concrete.queue):
        rank = z3.Store(rank, page, place)
    for key, page in concrete.entries:
        content = z3.Store(content, page, number[key])
        names = z3.Store(names, number[key], z3.Store(names[number[key]], page, True))
    head, tail = z3.IntVal(0), z3.IntVal(len(concrete.queue) - 1)
    elsewhere = z3.K(z3.IntSort(), z3.BoolVal(False))  # the spec does not say which (the order is its queue)
    return ReserveModel(z3.IntVal(len(concrete.refs)), refs, copies, content, names, rank, head, tail, elsewhere)


CARRIED = (inv_queue_is_the_free_pages, inv_reserved_held_once, inv_counts_non_negative)
"""The spec invariants the model's invariant carries. Not `inv_entries_distinct`: the model's
registrations are a set (a registration made twice is one), so a repeated one is invisible."""


def holds(concrete: ReserveState, keys: Sequence[Hashable]) -> bool:
    """The model's invariant (every size, every key) on the encoded state, decided by z3 within
    its resource units (never a clock)."""
    return invariant_holds(invariant(encode(concrete, keys)), RESOURCE_LIMIT, f"the reserve invariant on {concrete}")


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


def main() -> int:
    """Prove every transition, refute every broken form; 0 when all is as it must be."""
    return 0 if MODEL.report("reserve", 30, transitions(), broken()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
