"""Contracts on impl's kernels, run as plain Python (`kvsched.contracts.arrays`), for CrossHair.

The kernels hold impl's all-or-nothing promises, so these contracts state them directly on
small inputs: a failing kernel call restores every array exactly (counts, the free stack *and
its order*, tables); a successful one leaves a system where every spec invariant holds and every
written page is exclusive; the reclaim victim is the least recently used idle entry; a decode
round lowers exactly the ABI records and commits only a fully matching answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.contracts.arrays import Grid, Row, pure, records, stack
from kvsched.contracts.support import ORDERS, PAGES, holds, in_range, make_slot, make_table
from kvsched.impl.faults import OK
from kvsched.impl.lowering import apply_round, lower_round
from kvsched.impl.page_kernels import INVALID, ensure_rows, release_pages, retain_pages
from kvsched.impl.prefix import find_idle_lru
from kvsched.spec.batch import U32_MAX
from kvsched.spec.pool import PoolState
from kvsched.spec.prefix import StoreState
from kvsched.spec.slots import SchedulerState
from kvsched.spec.system import SystemState

Arrays = tuple[tuple[int, ...], ...]

# The kernels as plain Python, built once at import (not under CrossHair's tracing).
RETAIN_PAGES = pure(retain_pages)
RELEASE_PAGES = pure(release_pages)
ENSURE_ROWS = pure(ensure_rows)
FIND_IDLE_LRU = pure(find_idle_lru)
APPLY_ROUND = pure(apply_round)
LOWER_ROUND = pure(lower_round)


@dataclass(frozen=True, slots=True)
class KernelRun:
    """The kernel's status `(code, index, detail)` and its arrays before and after."""

    status: tuple[int, int, int]
    before: Arrays
    after: Arrays

    @property
    def ok(self) -> bool:
        """The kernel reported success."""
        return self.status[0] == OK


def _ids(*pages: int) -> Row:
    return Row([INVALID if page < 0 else page for page in pages])


def _free(refs: Row, order: int) -> tuple[Row, Row]:
    return stack([page for page in ORDERS[order] if refs[page] == 0], PAGES)


def _snapshot(refs: Row, free: Row, top: Row, *grids: Grid) -> Arrays:
    return (tuple(refs), tuple(free[: top[0]]), *(row for grid in grids for row in grid.as_tuples()))


def adds_one_each(run: KernelRun, pages: tuple[int, ...], delta: int) -> bool:
    """Every listed page's count moved by `delta` per occurrence; no other count moved."""
    expected = list(run.before[0])
    for page in pages:
        if page >= 0:
            expected[page] += delta
    return run.after[0] == tuple(expected)


def kernel_retain_pages(r0: int, r1: int, r2: int, p0: int, p1: int, p2: int, count: int, skip: bool) -> KernelRun:
    """`retain_pages` retains every page or, at the first refused one, none (three pages, so a
    refusal at the third undoes two).

    pre: in_range(r0, r1, r2, high=4) and in_range(p0, p1, p2, low=-1, high=PAGES) and 0 <= count <= 3
    post: __return__.ok or __return__.after == __return__.before
    post: not __return__.ok or adds_one_each(__return__, (p0, p1, p2)[:count], 1)
    """
    refs, pages = Row([r0, r1, r2]), _ids(p0, p1, p2)
    before = (tuple(refs),)
    status = RETAIN_PAGES(refs, pages, count, 4, skip)
    return KernelRun(status, before, (tuple(refs),))


def kernel_release_pages(r0: int, r1: int, r2: int, order: int, p0: int, p1: int, p2: int, count: int) -> KernelRun:
    """`release_pages` releases every page of a 3-entry table row (skipping unmapped entries) or
    none; a page reaching zero goes on top of the free stack, and a failure restores the stack's
    order.

    pre: in_range(r0, r1, r2, high=3) and 0 <= order < 6 and in_range(p0, p1, p2, low=-1, high=PAGES)
    pre: 0 <= count <= 3
    post: __return__.ok or __return__.after == __return__.before
    post: not __return__.ok or (adds_one_each(__return__, (p0, p1, p2)[:count], -1) and pushes_zeroed(__return__))
    """
    refs = Row([r0, r1, r2])
    free, top = _free(refs, order)
    pages = _ids(p0, p1, p2)
    before = _snapshot(refs, free, top)
    status = RELEASE_PAGES(refs, free, top, pages, count, True)
    return KernelRun(status, before, _snapshot(refs, free, top))


def pushes_zeroed(run: KernelRun) -> bool:
    """The stack only grew, by the pages whose count reached zero."""
    old, new = run.before[1], run.after[1]
    grown = new[len(old) :]
    return new[: len(old)] == old and set(grown) == {p for p in range(PAGES) if run.after[0][p] == 0} - set(old)


def rows_system(run: KernelRun, extras: tuple[int, int, int]) -> SystemState:
    """The arrays after the kernel as a spec system: two live requests owning the two rows."""
    refs, free, row0, row1 = run.after
    slots = tuple(
        make_slot(1, index + 1, make_table(*(-1 if e == INVALID else e for e in row)))
        for index, row in enumerate((row0, row1))
    )
    external = tuple(page for page, count in enumerate(extras) for _ in range(count))
    return SystemState(PoolState(refs, free, 4), StoreState((), 2), SchedulerState(slots), external)


def writes_exclusive(run: KernelRun, steps: tuple[tuple[int, int], ...], pages: Row) -> bool:
    """Every step's entry maps the page the step reported, and that page has one reference."""
    refs, _, *rows = run.after
    return all(rows[slot][logical] == pages[i] and refs[pages[i]] == 1 for i, (slot, logical) in enumerate(steps))


def ends_valid(run: KernelRun, extras: tuple[int, int, int], steps: tuple[tuple[int, int], ...], pages: Row) -> bool:
    """Every spec invariant holds over the arrays after, and every write is exclusive."""
    return holds(rows_system(run, extras)) and writes_exclusive(run, steps, pages)


def kernel_ensure_rows(
    t00: int, t01: int, t10: int, t11: int, e0: int, e1: int, e2: int, order: int, s0: int, l0: int, s1: int, l1: int
) -> tuple[KernelRun, tuple[int, int, int], tuple[tuple[int, int], ...], Row]:
    """`ensure_rows` makes every step's entry exclusively owned, or undoes every earlier step.

    pre: in_range(t00, t01, t10, t11, low=-1) and (t00 < 0 or t00 != t01) and (t10 < 0 or t10 != t11)
    pre: in_range(e0, e1, e2, high=1) and 0 <= order < 6 and in_range(s0, s1, high=1) and in_range(l0, l1, low=-1)
    post: __return__[0].ok or __return__[0].after == __return__[0].before
    post: not __return__[0].ok or ends_valid(*__return__)
    """
    tables = Grid([_ids(t00, t01), _ids(t10, t11)])
    counts = [e0, e1, e2]
    for page in (t00, t01, t10, t11):
        if page >= 0:
            counts[page] += 1
    refs = Row(counts)
    free, top = _free(refs, order)
    before = _snapshot(refs, free, top, tables)
    kinds, pages, sources = Row([0, 0]), Row([0, 0]), Row([0, 0])
    status = ENSURE_ROWS(tables, Row([s0, s1]), Row([l0, l1]), 2, refs, free, top, kinds, pages, sources)
    run = KernelRun(status, before, _snapshot(refs, free, top, tables))
    return run, (e0, e1, e2), ((s0, l0), (s1, l1)), pages


def lru_idle(a_mask: int, a_used: int, b_mask: int, b_used: int, extras: tuple[int, int, int]) -> int:
    """The occupied entry with the least (last used, index) whose pages nobody but the store
    holds (no extra reference on any of them); -1 when none is idle."""
    entries = [(a_used, 0, a_mask), (b_used, 1, b_mask)]
    idle = [
        (used, i) for used, i, mask in entries if mask and all(extras[p] == 0 for p in range(PAGES) if mask >> p & 1)
    ]
    return min(idle)[1] if idle else -1


def kernel_find_idle_lru(a_mask: int, a_used: int, b_mask: int, b_used: int, e0: int, e1: int, e2: int) -> int:
    """`find_idle_lru` names the least recently used idle entry (ties: the lower), or -1.

    pre: a_mask in (0, 1, 2, 3, 4, 5, 6) and b_mask in (0, 1, 2, 3, 4, 5, 6) and in_range(a_used, b_used, high=3)
    pre: in_range(e0, e1, e2, high=2)
    post: __return__ == lru_idle(a_mask, a_used, b_mask, b_used, (e0, e1, e2))
    """
    entries = [[p for p in range(PAGES) if mask >> p & 1] for mask in (a_mask, b_mask)]
    pages = Grid([entry + [0] * (2 - len(entry)) for entry in entries])
    counts = [e0, e1, e2]
    for entry in entries:
        for page in entry:
            counts[page] += 1
    occupied = Row([a_mask != 0, b_mask != 0])
    result: int = FIND_IDLE_LRU(
        pages,
        Row([len(entry) for entry in entries]),
        occupied,
        Row([a_used, b_used]),
        Row(counts),
        Row([0] * PAGES),
        Row([0] * PAGES),
    )
    return result


def commits_all(run: KernelRun, outputs: list[dict[str, int]], count: int) -> bool:
    """Each round slot consumed one token (saturating) and holds the output's token, ready."""
    _, counts, tokens, ready = run.after
    old = run.before[1]
    return all(
        counts[i] == min(old[i] + 1, U32_MAX) and tokens[i] == outputs[i]["next_token_id"] and ready[i]
        for i in range(count)
    ) and all(run.after[k][i] == run.before[k][i] for k in range(4) for i in range(count, 2))


def first_mismatch(outputs: list[dict[str, int]], count: int) -> int:
    """The first output that does not answer its slot (ids 7, 9 in slots 0, 1), or -1."""
    return next((i for i in range(count) if (outputs[i]["request_id"], outputs[i]["slot"]) != ((7, 9)[i], i)), -1)


def kernel_apply_round(
    count: int, c0: int, c1: int, r0: int, s0: int, n0: int, r1: int, s1: int, n1: int
) -> tuple[int, KernelRun, list[dict[str, int]], int]:
    """`apply_round` commits a round only when every output answers its item; else nothing.

    pre: 0 <= count <= 2 and in_range(c0, c1, n0, n1, high=U32_MAX) and in_range(r0, r1, s0, s1, high=10)
    post: __return__[0] == first_mismatch(__return__[2], count)
    post: commits_all(*__return__[1:]) if __return__[0] < 0 else __return__[1].after == __return__[1].before
    """
    outputs = records(2, "request_id", "slot", "next_token_id")
    for output, values in zip(outputs, ((r0, s0, n0), (r1, s1, n1)), strict=True):
        output.update(zip(("request_id", "slot", "next_token_id"), values, strict=True))
    ids, counts, tokens, ready = Row([7, 9]), Row([c0, c1]), Row([0, 0]), Row([False, False])
    before = (tuple(ids), tuple(counts), tuple(tokens), tuple(ready))
    bad = APPLY_ROUND(outputs, Row([0, 1]), count, ids, tokens, counts, ready)
    after = (tuple(ids), tuple(counts), tuple(tokens), tuple(ready))
    return bad, KernelRun((OK, -1, 0), before, after), outputs, count


ITEM_FIELDS = ("request_id", "slot", "token_id", "position", "block_table_offset", "logical_pages", "reserved")
OUTPUT_FIELDS = ("request_id", "slot", "next_token_id")


def lowered(states: tuple[int, ...], ready: tuple[bool, ...], tables: Grid) -> tuple[tuple[int, ...], ...] | int:
    """The ABI rows a round lowers (slot order), or the first DECODE slot without a token."""
    decoding = [slot for slot, state in enumerate(states) if state == 2]
    missing = next((slot for slot in decoding if not ready[slot]), None)
    if missing is not None:
        return missing
    return tuple(
        (10 + slot, slot, 20 + slot, 30 + slot, i * 2, 2, 0, *tables.rows[slot], 0, U32_MAX, 0)
        for i, slot in enumerate(decoding)
    )


def kernel_lower_round(
    s0: int, s1: int, s2: int, ready0: bool, ready1: bool, ready2: bool, t0: int, t1: int, t2: int
) -> tuple[tuple[tuple[int, ...], ...] | int, Grid]:
    """`lower_round` lowers the DECODE slots in slot order (offsets `i * width`, whole tables,
    outputs set to UNANSWERED), or reports the first one without an input token.

    pre: in_range(s0, s1, s2) and in_range(t0, t1, t2, low=-1)
    post: __return__[0] == lowered((s0, s1, s2), (ready0, ready1, ready2), __return__[1])
    """
    tables = Grid([_ids(t0, -1), _ids(-1, t1), _ids(t2, t2)])
    items, outputs = records(3, *ITEM_FIELDS), records(3, *OUTPUT_FIELDS)
    for record in items + outputs:
        record.update(dict.fromkeys(record, 5))  # stale values the round must overwrite
    block_tables = Row([5] * 6)
    exclusive = Row([1] * PAGES)  # every page held once, no page size: no write target refused
    code, count, _, _ = LOWER_ROUND(
        Row([s0, s1, s2]),
        Row([10, 11, 12]),
        Row([20, 21, 22]),
        Row([30, 31, 32]),
        Row([ready0, ready1, ready2]),
        tables,
        exclusive,
        0,
        items,
        block_tables,
        outputs,
        Row([0, 0, 0]),
    )
    if code >= 0:
        return count, tables  # the first slot with no input token
    rows = tuple(
        tuple(items[i][f] for f in ITEM_FIELDS) + tuple(block_tables[i * 2 : i * 2 + 2]) + tuple(outputs[i].values())
        for i in range(count)
    )
    return rows, tables


# The names only the docstring conditions use (CrossHair evaluates them in this module's globals).
CONDITION_VOCABULARY = (in_range,)
