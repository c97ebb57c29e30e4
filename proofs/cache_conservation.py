"""z3 proofs for the automatic prefix cache: its references are conserved for every pool size and
every key, and keys of different salts never meet.

**Conservation.** The state (unbounded arrays over the integers, `pages` any non-negative size):

    refs[p]    the pool's reference count of page p
    others[p]  references other owners hold (request tables, named prefixes, outside holders)
    cached[p]  the cache's reference: 1 when p is cached, else 0
    key[p]     the key cached on p (meaningful when cached)
    page[k]    the page key k is cached on, -1 when none (for every key k)
    copies[p]  how many times p is on the free stack

The invariant (`inv_refcount_equals_owners` with the cache counted, `inv_free_stack_exact`,
`inv_cache_well_formed`, as values): for every page, refs = others + cached, others >= 0,
cached is 0 or 1, p is on the free stack exactly once when its count is 0 and never otherwise;
a cached page's key names it; a named key's page is in the pool, cached, and keyed by it. So
free + held = pages, every page a key names is held, and no key names two pages.

Transitions: the cache's own (`insert` a held page under a free key, `evict` a page only the
cache holds, `hit`: a request retains a cached page), and the owners' moves on any page
(`allocate` a free page, `release` an owner's reference). Each is proved to keep the invariant
(`unsat` of its negation at every size) and shown enabled; the broken forms (evict and keep the
key; insert without a reference, so the page is freed and reused while its key names it; evict
a page a request still holds onto the free stack) are refuted with a counterexample at a
bounded size.

**Salts.** Page keys are modelled as the hash is assumed to behave: injective (each input has one
key: `parent`, `tokens` and `salt` invert it) with roots and chained keys domain-separated (a
root never equals a chained key). Then two keys of any depths up to `DEPTH` with different salts
are never equal (`unsat`), so different tenants, adapters or models never share a cached page;
for every depth this follows by induction (equal keys have equal parents, down to equal roots).
A root that leaves the salt out, or a hash that is not injective, gives a collision (`sat`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.inductive import decide
from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)
BOUND = 3  # bounded checks: 3 pages, keys 0..3
DEPTH = 6  # the salt theorem's key depths, checked up to this


@dataclass(frozen=True)
class Cache:
    """One state of the pool and the cache."""

    pages: Int
    refs: Arr
    others: Arr
    cached: Arr
    key: Arr
    page: Arr
    copies: Arr


def state(name: str) -> Cache:
    def array(field: str) -> Arr:
        return z3.Array(f"{name}.{field}", z3.IntSort(), z3.IntSort())

    return Cache(
        z3.Int(f"{name}.pages"),
        array("refs"),
        array("others"),
        array("cached"),
        array("key"),
        array("page"),
        array("copies"),
    )


def invariant(x: Cache, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size, every key), or over `BOUND` pages and keys."""

    def page_rule(p: Int) -> Bool:
        counted = z3.And(
            x.refs[p] == x.others[p] + x.cached[p], x.others[p] >= 0, z3.Or(x.cached[p] == 0, x.cached[p] == 1)
        )
        free_once = z3.If(x.refs[p] == 0, x.copies[p] == 1, x.copies[p] == 0)
        named = z3.Implies(x.cached[p] == 1, x.page[x.key[p]] == p)
        return z3.Implies(z3.And(p >= 0, p < x.pages), z3.And(counted, free_once, named))

    def key_rule(k: Int) -> Bool:
        p = x.page[k]
        return z3.Implies(p != -1, z3.And(p >= 0, p < x.pages, x.cached[p] == 1, x.key[p] == k))

    size = x.pages == BOUND if bounded else x.pages >= 0
    return z3.And(size, every(page_rule, "p", range(BOUND), bounded), every(key_rule, "k", range(BOUND + 1), bounded))


def _same(x: Cache, y: Cache, *changed: str) -> Bool:
    fields = ("pages", "refs", "others", "cached", "key", "page", "copies")
    return z3.And(*(getattr(y, name) == getattr(x, name) for name in fields if name not in changed))


def insert(x: Cache, y: Cache, p: Int, k: Int, *, retain: bool = True) -> Bool:
    """A written page still held by its request enters the cache under a key not cached."""
    return z3.And(
        p >= 0,
        p < x.pages,
        x.refs[p] > 0,
        x.cached[p] == 0,
        x.page[k] == -1,
        y.refs == z3.Store(x.refs, p, x.refs[p] + (1 if retain else 0)),
        y.cached == z3.Store(x.cached, p, 1),
        y.key == z3.Store(x.key, p, k),
        y.page == z3.Store(x.page, k, p),
        _same(x, y, "refs", "cached", "key", "page"),
    )


def evict(x: Cache, y: Cache, p: Int, *, drop_key: bool = True, free_it: bool = False) -> Bool:
    """A page only the cache holds leaves it and goes on the free stack (`free_it`: the broken
    form that frees the page whoever still holds it)."""
    guard = [p >= 0, p < x.pages, x.cached[p] == 1]
    if not free_it:
        guard.append(x.refs[p] == 1)
    count = 0 if free_it else x.refs[p] - 1
    return z3.And(
        *guard,
        y.refs == z3.Store(x.refs, p, count),
        y.cached == z3.Store(x.cached, p, 0),
        y.page == (z3.Store(x.page, x.key[p], -1) if drop_key else x.page),
        y.copies == z3.Store(x.copies, p, x.copies[p] + z3.If(count == 0, 1, 0)),
        _same(x, y, "refs", "cached", "page", "copies"),
    )


def hit(x: Cache, y: Cache, k: Int) -> Bool:
    """A request's admission retains the page cached under `k`."""
    p = x.page[k]
    return z3.And(
        p != -1,
        y.refs == z3.Store(x.refs, p, x.refs[p] + 1),
        y.others == z3.Store(x.others, p, x.others[p] + 1),
        _same(x, y, "refs", "others"),
    )


def allocate(x: Cache, y: Cache, p: Int) -> Bool:
    """The pool hands out the free page p to an owner."""
    return z3.And(
        p >= 0,
        p < x.pages,
        x.copies[p] >= 1,
        y.refs == z3.Store(x.refs, p, 1),
        y.others == z3.Store(x.others, p, 1),
        y.copies == z3.Store(x.copies, p, x.copies[p] - 1),
        _same(x, y, "refs", "others", "copies"),
    )


def release(x: Cache, y: Cache, p: Int) -> Bool:
    """An owner other than the cache drops its reference on p (at zero, p is freed)."""
    count = x.refs[p] - 1
    return z3.And(
        p >= 0,
        p < x.pages,
        x.others[p] > 0,
        y.refs == z3.Store(x.refs, p, count),
        y.others == z3.Store(x.others, p, x.others[p] - 1),
        y.copies == z3.Store(x.copies, p, x.copies[p] + z3.If(count == 0, 1, 0)),
        _same(x, y, "refs", "others", "copies"),
    )


Transition = Callable[[Cache, Cache], Bool]


def transitions() -> dict[str, Transition]:
    """Every transition on pages and the cache (page and key free variables)."""
    p, k = z3.Ints("p k")
    return {
        "insert": lambda x, y: insert(x, y, p, k),
        "evict": lambda x, y: evict(x, y, p),
        "hit": lambda x, y: hit(x, y, k),
        "allocate": lambda x, y: allocate(x, y, p),
        "release": lambda x, y: release(x, y, p),
    }


def broken() -> dict[str, Transition]:
    """The broken forms that must be refuted."""
    p, k = z3.Ints("p k")
    return {
        "evict_keeps_key": lambda x, y: evict(x, y, p, drop_key=False),
        "insert_without_reference": lambda x, y: insert(x, y, p, k, retain=False),
        "evict_frees_a_held_page": lambda x, y: evict(x, y, p, free_it=True),
    }


def _within_bound() -> Bool:
    p, k = z3.Ints("p k")
    return z3.And(p >= 0, p < BOUND, k >= 0, k <= BOUND)


# -- salts ------------------------------------------------------------------------------------

Key = z3.DeclareSort("Key")
ROOT = z3.Function("root", z3.IntSort(), Key)  # the root key of a salt
CHAIN = z3.Function("chain", Key, z3.IntSort(), Key)  # a page's key after its parent's
SALT_OF = z3.Function("salt_of", Key, z3.IntSort())
PARENT = z3.Function("parent", Key, Key)
TOKENS = z3.Function("tokens", Key, z3.IntSort())
IS_ROOT = z3.Function("is_root", Key, z3.BoolSort())


def hash_axioms(*, injective: bool = True) -> list[Bool]:
    """The hash as the proofs assume it: injective, roots and chained keys domain-separated."""
    salt, page = z3.Ints("ax.salt ax.page")
    parent = z3.Const("ax.parent", Key)
    axioms = [
        z3.ForAll([salt], IS_ROOT(ROOT(salt))),
        z3.ForAll([parent, page], z3.Not(IS_ROOT(CHAIN(parent, page)))),
    ]
    if injective:
        axioms += [
            z3.ForAll([salt], SALT_OF(ROOT(salt)) == salt),
            z3.ForAll(
                [parent, page], z3.And(PARENT(CHAIN(parent, page)) == parent, TOKENS(CHAIN(parent, page)) == page)
            ),
        ]
    return axioms


def key_of(salt: Int, pages: list[Int], *, salted: bool = True) -> z3.ExprRef:
    """The key of the last of `pages` (each page's tokens as one value) under `salt` (`salted`
    False: the broken form whose root leaves the salt out)."""
    key = ROOT(salt if salted else z3.IntVal(0))
    for page in pages:
        key = CHAIN(key, page)
    return key


def salts_separate(depth_a: int, depth_b: int, *, injective: bool = True) -> z3.CheckSatResult:
    """`unsat`: no key of depth `depth_a` under one salt equals a key of depth `depth_b` under
    another (`sat`, a collision, when the hash is not assumed injective)."""
    first, second = z3.Ints("salt.a salt.b")
    pages_a = [z3.Int(f"a.{index}") for index in range(depth_a)]
    pages_b = [z3.Int(f"b.{index}") for index in range(depth_b)]
    collide = key_of(first, pages_a) == key_of(second, pages_b)
    return decide(z3.And(*hash_axioms(injective=injective), first != second, collide), RESOURCE_LIMIT)


def unsalted_keys_collide(depth: int) -> z3.CheckSatResult:
    """`unsat` when a root without the salt gives two different salts the same key for the same
    pages, whatever the hash (the broken form, refuted: the negation of a collision is unsat)."""
    first, second = z3.Ints("salt.a salt.b")
    pages = [z3.Int(f"a.{index}") for index in range(depth)]
    same = key_of(first, pages, salted=False) == key_of(second, pages, salted=False)
    return decide(z3.And(first != second, z3.Not(same)), RESOURCE_LIMIT)


def main() -> int:
    """Prove every transition and the salt theorem, refute every broken form; 0 when all is as
    it must be."""
    ok = MODEL.report("prefix cache", 26, transitions(), broken())
    separate = all(salts_separate(a, b) == z3.unsat for a in range(DEPTH + 1) for b in range(DEPTH + 1))
    unsalted = unsalted_keys_collide(2) == z3.unsat
    not_injective = salts_separate(2, 2, injective=False) == z3.sat
    ok &= separate and unsalted and not_injective
    print(f"prefix cache  {'salts never share a key':<26} {'proved' if separate else 'NOT PROVED'} (depths 0..{DEPTH})")
    print(f"prefix cache  {'salt_dropped':<26} {'refuted' if unsalted else 'NOT REFUTED'}")
    print(f"prefix cache  {'hash_not_injective':<26} {'refuted' if not_injective else 'NOT REFUTED'}")
    return 0 if ok else 1


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


if __name__ == "__main__":
    raise SystemExit(main())
