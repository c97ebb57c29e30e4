"""z3 proofs for the KV groups' ownership (`kvsched.spec.kv_groups`): for every number of pages
and of groups, every page's count is its holders across every group's tables and the cache, the
free stack holds exactly the pages nobody holds, a page held in a table is held in its own
group's tables only, and the null page is never counted, cached or free.

The state (unbounded arrays over the integers; any number of pages and groups):

    refs[p]     a page's count              free[p]     times p is on the free stack
    mine[p]     entries naming p in the tables of p's group (`owner[p]`)
    foreign[p]  entries naming p in the tables of any other group
    cached[p]   1 when the cache holds p    owner[p]    the group whose KV p holds

The invariant, for every page: the null page (0) has no count, entry, cache hold or place on the
free stack; any other page's count is `mine + cached`, each non-negative (a cache holds a page at
most once), no other group's table names it, and it is on the free stack once when its count is 0
and never otherwise.

Transitions, each with free variables `p` (a page) and `g` (a group):

    take      a free page becomes group g's, in one of its tables (a pass's fresh page)
    attach    a page cached under group g's key is attached to a table of g (a hit)
    release   a table lets go of a page (a free, a window's page left behind, a rejected draft's
              page truncated)
    cache     a page a table holds enters the cache
    evict     a cached page only the cache holds leaves it, and is free

Each is proved to keep the invariant (`unsat` of its negation at every size) and shown enabled.
The broken forms, each an upstream bug's shape, are refuted with a counterexample at a bounded
size: a window's page let go while its table keeps it (SGLang #24153: let go twice), a page
leaving a window freed whoever else holds it (SGLang PR #27586), the null page let go with a freed
table (SGLang PR #38269), and a page of another group attached by a hit (vLLM PR #50457, #47926).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every, invariant_holds
from kvsched.spec.kv_groups import GroupState, counts_are_holders, free_is_unheld

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)
BOUND = 3  # bounded checks: 3 pages, groups 0 and 1
NULL = 0
ARRAYS = ("refs", "free", "mine", "foreign", "cached", "owner")


@dataclass(frozen=True)
class GroupModel:
    """One state of the groups' ownership."""

    pages: Int
    refs: Arr
    free: Arr
    mine: Arr
    foreign: Arr
    cached: Arr
    owner: Arr


def state(name: str) -> GroupModel:
    arrays = {field: z3.Array(f"{name}.{field}", z3.IntSort(), z3.IntSort()) for field in ARRAYS}
    return GroupModel(z3.Int(f"{name}.pages"), **arrays)


def _in_pool(x: GroupModel, p: Int) -> Bool:
    return z3.And(p >= 0, p < x.pages)


def invariant(x: GroupModel, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size), or over `BOUND` pages."""

    def page(p: Int) -> Bool:
        null = z3.And(x.refs[p] == 0, x.free[p] == 0, x.mine[p] == 0, x.foreign[p] == 0, x.cached[p] == 0)
        counted = z3.And(x.mine[p] >= 0, x.foreign[p] == 0, x.cached[p] >= 0, x.cached[p] <= 1)
        other = z3.And(counted, x.refs[p] == x.mine[p] + x.cached[p], x.free[p] == z3.If(x.refs[p] == 0, 1, 0))
        return z3.Implies(_in_pool(x, p), z3.If(p == NULL, null, other))

    size = x.pages == BOUND if bounded else x.pages >= 2
    return z3.And(size, every(page, "p", range(BOUND), bounded))


def _same(x: GroupModel, y: GroupModel, *changed: str) -> Bool:
    return z3.And(y.pages == x.pages, *(getattr(y, name) == getattr(x, name) for name in ARRAYS if name not in changed))


def _add(x: GroupModel, y: GroupModel, field: str, p: Int, delta: Int | int) -> Bool:
    before: Arr = getattr(x, field)
    after: Arr = getattr(y, field)
    return after == z3.Store(before, p, before[p] + delta)


def _count(x: GroupModel, y: GroupModel, p: Int, delta: int) -> Bool:
    """`p`'s count moves by `delta`: reaching 0 it is pushed on the free stack, leaving 0 taken off."""
    after = x.refs[p] + delta
    pushed = z3.If(z3.And(after == 0, x.refs[p] != 0), 1, 0)
    popped = z3.If(z3.And(after != 0, x.refs[p] == 0), -1, 0)
    return z3.And(y.refs == z3.Store(x.refs, p, after), y.free == z3.Store(x.free, p, x.free[p] + pushed + popped))


def take(x: GroupModel, y: GroupModel, p: Int, g: Int) -> Bool:
    """A free page becomes group `g`'s, held by one of its tables."""
    return z3.And(
        _in_pool(x, p),
        g >= 0,
        x.free[p] == 1,
        y.refs == z3.Store(x.refs, p, 1),
        y.free == z3.Store(x.free, p, 0),
        y.mine == z3.Store(x.mine, p, 1),
        y.owner == z3.Store(x.owner, p, g),
        _same(x, y, "refs", "free", "mine", "owner"),
    )


def attach(x: GroupModel, y: GroupModel, p: Int, g: Int, *, any_group: bool = False) -> Bool:
    """A cached page of group `g` is attached to one of g's tables (`any_group`: whichever group's
    page it is)."""
    own = x.owner[p] == g
    entry = (
        z3.If(
            own,
            z3.And(_add(x, y, "mine", p, 1), y.foreign == x.foreign),
            z3.And(_add(x, y, "foreign", p, 1), y.mine == x.mine),
        )
        if any_group
        else z3.And(own, _add(x, y, "mine", p, 1), y.foreign == x.foreign)
    )
    return z3.And(
        _in_pool(x, p),
        g >= 0,
        x.cached[p] == 1,
        entry,
        _count(x, y, p, 1),
        _same(x, y, "mine", "foreign", "refs", "free"),
    )


def release(
    x: GroupModel, y: GroupModel, p: Int, *, entry_kept: bool = False, whoever: bool = False, null: bool = False
) -> Bool:
    """A table lets go of `p` (`entry_kept`: its count drops but the table keeps naming it;
    `whoever`: it is freed whoever else holds it; `null`: the null page is let go too)."""
    held = z3.Or(x.mine[p] > 0, p == NULL) if null else x.mine[p] > 0
    entry = y.mine == x.mine if entry_kept else _add(x, y, "mine", p, z3.If(x.mine[p] > 0, -1, 0))
    count = (
        z3.And(y.refs == z3.Store(x.refs, p, 0), y.free == z3.Store(x.free, p, 1)) if whoever else _count(x, y, p, -1)
    )
    return z3.And(_in_pool(x, p), held, entry, count, _same(x, y, "mine", "refs", "free"))


def cache(x: GroupModel, y: GroupModel, p: Int) -> Bool:
    return z3.And(
        _in_pool(x, p),
        x.mine[p] > 0,
        x.cached[p] == 0,
        y.cached == z3.Store(x.cached, p, 1),
        _count(x, y, p, 1),
        _same(x, y, "cached", "refs", "free"),
    )


def evict(x: GroupModel, y: GroupModel, p: Int) -> Bool:
    return z3.And(
        _in_pool(x, p),
        x.cached[p] == 1,
        x.refs[p] == 1,
        y.cached == z3.Store(x.cached, p, 0),
        _count(x, y, p, -1),
        _same(x, y, "cached", "refs", "free"),
    )


Transition = Callable[[GroupModel, GroupModel], Bool]


def transitions() -> dict[str, Transition]:
    """Every transition (page `p`, group `g` free variables); each event of the KV groups
    registers the transitions it is made of."""
    p, g = z3.Ints("p g")
    return {
        "take": lambda x, y: take(x, y, p, g),
        "attach": lambda x, y: attach(x, y, p, g),
        "release": lambda x, y: release(x, y, p),
        "cache": lambda x, y: cache(x, y, p),
        "evict": lambda x, y: evict(x, y, p),
    }


def broken() -> dict[str, Transition]:
    """The broken forms that must be refuted."""
    p, g = z3.Ints("p g")
    return {
        "sglang_24153_window_page_released_twice": lambda x, y: release(x, y, p, entry_kept=True),
        "sglang_27586_window_frees_a_cached_page": lambda x, y: release(x, y, p, whoever=True),
        "sglang_38269_null_page_freed": lambda x, y: release(x, y, p, null=True),
        "vllm_50457_another_groups_page_attached": lambda x, y: attach(x, y, p, g, any_group=True),
    }


def _within_bound() -> Bool:
    p, g = z3.Ints("p g")
    return z3.And(p >= 0, p < BOUND, g >= 0, g <= 1)


# -- the model tied to the spec's invariants -------------------------------------------------


def encode(concrete: GroupState) -> GroupModel:
    """A concrete state as a ground model state (ground for any state, corrupted or not). A page's
    owner is the group its content names, else the first group whose table holds it."""
    zero = z3.K(z3.IntSort(), z3.IntVal(0))
    arrays = dict.fromkeys(ARRAYS, zero)
    owner = {page: content[0] for page, content in enumerate(concrete.content) if content is not None}
    for held in concrete.requests:
        for group, table in enumerate(held.tables):
            for page in table:
                owner.setdefault(page, group)

    def bump(field: str, page: int) -> None:
        arrays[field] = z3.Store(arrays[field], page, z3.simplify(arrays[field][page] + 1))

    for page, count in enumerate(concrete.refs):
        arrays["refs"] = z3.Store(arrays["refs"], page, count)
    for page, group in owner.items():
        arrays["owner"] = z3.Store(arrays["owner"], page, group)
    for page in concrete.free:
        bump("free", page)
    for entry in concrete.cache:
        bump("cached", entry.page)
    for held in concrete.requests:
        for group, table in enumerate(held.tables):
            for page in table:
                if page != NULL:
                    bump("mine" if owner[page] == group else "foreign", page)
    return GroupModel(z3.IntVal(len(concrete.refs)), **arrays)


CARRIED = (counts_are_holders, free_is_unheld)
"""The spec invariants the model's invariant carries (the content ones are the explorer's)."""


def holds(concrete: GroupState) -> bool:
    """The model's invariant (every size) on the encoded state, decided by z3 within its resource
    units (never a clock)."""
    return invariant_holds(invariant(encode(concrete)), RESOURCE_LIMIT, f"the groups' invariant on {concrete}")


def main() -> int:
    """Prove every transition, refute every broken form; 0 when all is as it must be."""
    return 0 if MODEL.report("kv groups", 40, transitions(), broken()) else 1


MODEL = SmallModel(state, invariant, _within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


if __name__ == "__main__":
    raise SystemExit(main())
