"""Kernel pairs for `crosshair diffbehavior`: a sequence of spec transitions against the impl
kernel that performs it in one call, on plain lists (symbolic throughout).

`crosshair diffbehavior` ignores preconditions, so every pair bounds its own inputs: outside the
domain both return None. A pair returns the refusal's error type (None on success) and every
array the operation touches, so a kernel that fails without restoring the free stack's order,
or succeeds with a different page, differs from the spec.
"""

from __future__ import annotations

from typing import Any

from kvsched.contracts.arrays import Grid, Row, pure, stack
from kvsched.contracts.support import ORDERS, PAGES, first, in_range, make_table
from kvsched.impl import faults
from kvsched.impl.page_kernels import ALLOCATED, COPY, EXISTING, INVALID, ensure_rows, release_pages, retain_pages
from kvsched.spec import table as table_ops
from kvsched.spec.errors import KvschedError
from kvsched.spec.pool import Copy, Existing, PoolState

RETAIN_PAGES = pure(retain_pages)
RELEASE_PAGES = pure(release_pages)
ENSURE_ROWS = pure(ensure_rows)
Outcome = tuple[Any, ...] | None


def _error(code: int, detail: int) -> str:
    return type(faults.get_error(code, detail, physical_pages=PAGES, logical_pages=2, page=0)).__name__


def _free(refs: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(page for page in reversed(range(PAGES)) if refs[page] == 0)


# -- kernel pairs -----------------------------------------------------------------------------


def _retain_domain(r0: int, r1: int, r2: int, p0: int, p1: int, p2: int, count: int) -> bool:
    return in_range(r0, r1, r2, high=4) & in_range(p0, p1, p2, low=-1, high=PAGES) & in_range(count, high=3)


def spec_retain(r0: int, r1: int, r2: int, p0: int, p1: int, p2: int, count: int) -> Outcome:
    """`table.retain_all` on the pages (-1 is an invalid id): the refusal or the new counts."""
    if not _retain_domain(r0, r1, r2, p0, p1, p2, count):
        return None
    refs = (r0, r1, r2)
    try:
        pool = table_ops.retain_all(PoolState(refs, _free(refs), 4), first(count, p0, p1, p2))
    except KvschedError as error:
        return type(error).__name__, refs
    return None, pool.refs


def impl_retain(r0: int, r1: int, r2: int, p0: int, p1: int, p2: int, count: int) -> Outcome:
    """`retain_pages` on the same pages."""
    if not _retain_domain(r0, r1, r2, p0, p1, p2, count):
        return None
    refs = Row([r0, r1, r2])
    pages = Row([INVALID if p < 0 else p for p in first(count, p0, p1, p2)])
    code, _, detail = RETAIN_PAGES(refs, pages, len(pages), 4, False)
    return (None if code == faults.OK else _error(code, detail)), tuple(refs)


def _release_domain(r0: int, r1: int, r2: int, order: int, p0: int, p1: int, p2: int) -> bool:
    return in_range(r0, r1, r2, high=3) & in_range(order, high=5) & in_range(p0, p1, p2, low=-1, high=PAGES)


def spec_release(r0: int, r1: int, r2: int, order: int, p0: int, p1: int, p2: int) -> Outcome:
    """`table.release_all` of the row (p0, p1, p2): the refusal, or the counts and free stack."""
    if not _release_domain(r0, r1, r2, order, p0, p1, p2):
        return None
    refs = (r0, r1, r2)
    pool = PoolState(refs, tuple(page for page in ORDERS[order] if refs[page] == 0), 4)
    try:
        _, after = table_ops.release_all(make_table(p0, p1, p2), pool)
    except KvschedError as error:
        return type(error).__name__, pool.refs, pool.free
    return None, after.refs, after.free


def impl_release(r0: int, r1: int, r2: int, order: int, p0: int, p1: int, p2: int) -> Outcome:
    """`release_pages` of the same row, unmapped entries skipped."""
    if not _release_domain(r0, r1, r2, order, p0, p1, p2):
        return None
    refs = Row([r0, r1, r2])
    free, top = stack([page for page in ORDERS[order] if refs[page] == 0], PAGES)
    row = Row([INVALID if p < 0 else p for p in (p0, p1, p2)])
    code, _, detail = RELEASE_PAGES(refs, free, top, row, 3, True)
    return (None if code == faults.OK else _error(code, detail)), tuple(refs), tuple(free[: top[0]])


def _ensure_domain(t0: int, t1: int, e0: int, e1: int, e2: int, order: int, l0: int, l1: int) -> bool:
    table_ok = in_range(t0, t1, low=-1) & ((t0 < 0) | (t0 != t1))
    return table_ok & in_range(e0, e1, e2, high=2) & in_range(order, high=5) & in_range(l0, l1, low=-1)


def _counts(table: tuple[int, int], extras: tuple[int, int, int]) -> list[int]:
    counts = list(extras)
    for page in table:
        if page >= 0:
            counts[page] += 1
    return counts


def spec_ensure(t0: int, t1: int, e0: int, e1: int, e2: int, order: int, l0: int, l1: int) -> Outcome:
    """Two `table.ensure_writable` calls on a request table whose pages other holders may share
    (`extras`), all or nothing: the refusal, or the table, counts, free stack and each step's
    (kind, page, copy source)."""
    if not _ensure_domain(t0, t1, e0, e1, e2, order, l0, l1):
        return None
    table = make_table(t0, t1)
    refs = tuple(_counts((t0, t1), (e0, e1, e2)))
    pool = before = PoolState(refs, tuple(page for page in ORDERS[order] if refs[page] == 0), 4)
    steps = []
    try:
        for logical in (l0, l1):
            table, pool, action = table_ops.ensure_writable(table, pool, logical)
            if isinstance(action, Copy):
                steps.append((COPY, action.destination, action.source))
            else:
                steps.append((EXISTING if isinstance(action, Existing) else ALLOCATED, action.page, INVALID))
    except KvschedError as error:
        return type(error).__name__, make_table(t0, t1), before.refs, before.free
    return None, table, pool.refs, pool.free, tuple(steps)


def impl_ensure(t0: int, t1: int, e0: int, e1: int, e2: int, order: int, l0: int, l1: int) -> Outcome:
    """`ensure_rows` with the same two steps, in one call."""
    if not _ensure_domain(t0, t1, e0, e1, e2, order, l0, l1):
        return None
    grid = Grid([[INVALID if p < 0 else p for p in (t0, t1)]])
    refs = Row(_counts((t0, t1), (e0, e1, e2)))
    free, top = stack([page for page in ORDERS[order] if refs[page] == 0], PAGES)
    kinds, pages, sources = Row([0, 0]), Row([0, 0]), Row([0, 0])
    code, _, detail = ENSURE_ROWS(grid, Row([0, 0]), Row([l0, l1]), 2, refs, free, top, kinds, pages, sources)
    table = tuple(None if p == INVALID else p for p in grid.rows[0])
    if code != faults.OK:
        return _error(code, detail), table, tuple(refs), tuple(free[: top[0]])
    return None, table, tuple(refs), tuple(free[: top[0]]), tuple(zip(kinds, pages, sources, strict=True))


# Concrete inputs inside each pair's domain: the gate runs them before CrossHair (both pairs
# must return a non-None, equal outcome), so a pair that bounds away its whole domain, or
# crashes alike on both sides, cannot pass vacuously.
SAMPLES: dict[str, tuple[tuple[int, ...], ...]] = {
    # refusals at the third page, after two retains or releases to undo (one of them a push)
    "retain": ((1, 0, 4, 0, 2, 2, 2), (2, 1, 1, 2, 1, 0, 3), (0, 1, 1, -1, 0, 1, 1), (1, 1, 4, 0, 1, 2, 3)),
    "release": ((1, 0, 2, 3, 0, 2, -1), (1, 1, 0, 5, 1, -1, 0), (0, 1, 1, 0, 0, 1, 2), (1, 2, 0, 0, 0, 1, 2)),
    # the last: a copy, then an exhausted pool, so the copy is undone
    "ensure": ((0, 1, 1, 0, 0, 2, 0, 1), (0, -1, 0, 0, 0, 4, 1, 0), (2, 1, 0, 1, 2, 0, 0, 2), (0, 1, 1, 1, 0, 0, 0, 1)),
}
