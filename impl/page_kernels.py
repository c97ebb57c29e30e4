"""Kernels over the pool's arrays: retaining, releasing and making pages writable, all or nothing.

Each kernel applies its steps in input order, exactly as the spec's sequence of single-page
transitions would, and on the first failing step undoes every earlier step before returning the
failure (see `faults`). Undo is exact because of two facts about the free stack:

    retain never touches the stack; a release that hits zero pushes onto the top;
    an allocation pops the top and leaves the popped id in place below the new top.

So undoing in reverse order pops exactly what was pushed and re-pushes (by moving `top` back up)
exactly what was popped, restoring the stack's order, not just its contents.

Arrays: `refs` uint32[pages], `free` int32/int64[pages] (the stack, valid below `top[0]`),
`top` int64[1], tables uint32[requests, logical_pages] with INVALID_BLOCK where unmapped.
"""

from __future__ import annotations

from typing import Any

from kvsched.impl.faults import (
    DOUBLE_RELEASE,
    EXHAUSTED,
    FREE_RETAIN,
    FREE_WRITE,
    OK,
    OUT_OF_POOL,
    OUT_OF_TABLE,
    OVERFLOW,
)
from kvsched.impl.jit import jit

INVALID = 0xFFFFFFFF  # INVALID_BLOCK, as the kernels' literal
EXISTING = 0
ALLOCATED = 1
COPY = 2

Status = tuple[int, int, int]  # (code, input index, detail)


@jit
def retain_pages(refs: Any, pages: Any, count: int, max_references: int, skip_invalid: bool) -> Status:
    """Retain `pages[:count]` in order (INVALID entries skipped when `skip_invalid`)."""
    size = refs.shape[0]
    code, at, detail = OK, -1, 0
    for index in range(count):
        page = pages[index]
        if skip_invalid and page == INVALID:
            continue
        if page < 0 or page >= size:
            code, at, detail = OUT_OF_POOL, index, 0
            break
        held = refs[page]
        if held == 0:
            code, at, detail = FREE_RETAIN, index, 0
            break
        if held >= max_references:
            code, at, detail = OVERFLOW, index, held
            break
        refs[page] = held + 1
    if code != OK:
        for index in range(at - 1, -1, -1):
            page = pages[index]
            if not (skip_invalid and page == INVALID):
                refs[page] -= 1
    return code, at, detail


@jit
def release_pages(refs: Any, free: Any, top: Any, pages: Any, count: int, skip_invalid: bool) -> Status:
    """Release `pages[:count]` in order; a page reaching zero goes on top of the free stack."""
    size = refs.shape[0]
    code, at = OK, -1
    for index in range(count):
        page = pages[index]
        if skip_invalid and page == INVALID:
            continue
        if page < 0 or page >= size:
            code, at = OUT_OF_POOL, index
            break
        held = refs[page]
        if held == 0:
            code, at = DOUBLE_RELEASE, index
            break
        refs[page] = held - 1
        if held == 1:
            free[top[0]] = page
            top[0] += 1
    if code != OK:
        for index in range(at - 1, -1, -1):
            page = pages[index]
            if skip_invalid and page == INVALID:
                continue
            if refs[page] == 0:
                top[0] -= 1
            refs[page] += 1
    return code, at, 0


@jit
def clear_row(row: Any) -> None:
    """Unmap every entry."""
    for index in range(row.shape[0]):
        row[index] = INVALID


@jit
def ensure_rows(
    tables: Any,
    slots: Any,
    logical_pages: Any,
    count: int,
    refs: Any,
    free: Any,
    top: Any,
    kinds: Any,
    pages: Any,
    sources: Any,
) -> Status:
    """`ensure_writable(tables[slots[i]], logical_pages[i])` for i < count, in order, all or nothing.

    Records each step's action in `kinds[i]` (EXISTING, ALLOCATED, COPY), the page now mapped in
    `pages[i]` and a copy's source in `sources[i]` (INVALID otherwise).
    """
    size = refs.shape[0]
    width = tables.shape[1]
    code, at, detail = OK, -1, 0
    for index in range(count):
        slot = slots[index]
        logical = logical_pages[index]
        if logical < 0 or logical >= width:
            code, at, detail = OUT_OF_TABLE, index, logical
            break
        current = tables[slot, logical]
        if current != INVALID:
            if current >= size:
                code, at, detail = OUT_OF_POOL, index, current
                break
            held = refs[current]
            if held == 0:
                code, at, detail = FREE_WRITE, index, current
                break
            if held == 1:
                kinds[index] = EXISTING
                pages[index] = current
                sources[index] = INVALID
                continue
        if top[0] == 0:
            code, at, detail = EXHAUSTED, index, 0
            break
        top[0] -= 1
        fresh = free[top[0]]
        refs[fresh] = 1
        tables[slot, logical] = fresh
        pages[index] = fresh
        if current == INVALID:
            kinds[index] = ALLOCATED
            sources[index] = INVALID
        else:
            refs[current] -= 1  # held > 1: never reaches zero, never pushes
            kinds[index] = COPY
            sources[index] = current
    if code != OK:
        undo_rows(tables, slots, logical_pages, at, refs, top, kinds, pages, sources)
    return code, at, detail


@jit
def undo_rows(
    tables: Any, slots: Any, logical_pages: Any, count: int, refs: Any, top: Any, kinds: Any, pages: Any, sources: Any
) -> None:
    """Undo the first `count` steps `ensure_rows` recorded, newest first."""
    for index in range(count - 1, -1, -1):
        kind = kinds[index]
        if kind == EXISTING:
            continue
        slot = slots[index]
        logical = logical_pages[index]
        refs[pages[index]] = 0
        top[0] += 1  # the popped id still sits there: this re-pushes it in its old place
        if kind == ALLOCATED:
            tables[slot, logical] = INVALID
        else:
            tables[slot, logical] = sources[index]
            refs[sources[index]] += 1


@jit
def collect_copies(kinds: Any, pages: Any, sources: Any, count: int, copy_sources: Any, copy_destinations: Any) -> int:
    """Compact the COPY steps into (source, destination) arrays; how many there are."""
    copies = 0
    for index in range(count):
        if kinds[index] == COPY:
            copy_sources[copies] = sources[index]
            copy_destinations[copies] = pages[index]
            copies += 1
    return copies


@jit
def is_clear(row: Any) -> bool:
    """No entry is mapped."""
    for index in range(row.shape[0]):  # noqa: SIM110  (numba compiles loops, not generators)
        if row[index] != INVALID:
            return False
    return True


@jit
def mapped_prefix(row: Any) -> int:
    """How many leading entries of `row` are mapped, or -1 when a mapped entry follows an
    unmapped one (the mapped pages are not exactly the first)."""
    count = 0
    while count < row.shape[0] and row[count] != INVALID:
        count += 1
    for index in range(count, row.shape[0]):
        if row[index] != INVALID:
            return -1
    return count


@jit
def repeats_in(pages: Any, row: Any, start: int) -> bool:
    """A page of `pages` appears twice, or among `row[:start]`."""
    for index in range(pages.shape[0]):
        for other in range(index):
            if pages[other] == pages[index]:
                return True
        for other in range(start):
            if row[other] == pages[index]:
                return True
    return False
