"""One request's logical page table as a uint32 row: INVALID_BLOCK where a page is unmapped.

Refines `kvsched.spec.table`: `to_spec()` is the abstraction function

    Table = tuple(None if entry == INVALID_BLOCK else entry for entry in row)

`INVALID_BLOCK` never leaves impl: the public API takes and returns `None` for an unmapped
page, exactly like the spec. The row functions here serve both a standalone
`SequenceBlockTable` and the scheduler's `[requests, logical_pages]` array, whose rows are the
request tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvsched.impl.page_kernels import clear_row, is_clear, mapped_prefix, repeats_in
from kvsched.impl.pool import BlockPool, release_array, retain_array, retain_sequence
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK, U32_MAX
from kvsched.spec.domain import as_int, require_int, require_size
from kvsched.spec.pool import Copy, CopyOnWrite
from kvsched.spec.table import Table, repeats_a_page

TableRow = npt.NDArray[np.uint32]


def to_spec_table(row: TableRow) -> Table:
    """The abstraction function for one row."""
    entries: list[int] = row.tolist()
    if INVALID_BLOCK not in entries:
        return tuple(entries)
    mapped = entries.index(INVALID_BLOCK)
    if entries.count(INVALID_BLOCK) == len(entries) - mapped:  # a mapped run, then nothing: the usual row
        return tuple(entries[:mapped]) + (None,) * (len(entries) - mapped)
    return tuple([None if entry == INVALID_BLOCK else entry for entry in entries])


def require_logical_page(row: TableRow, logical_page: object) -> int:
    """`logical_page` as an index into `row`, or the spec's error."""
    logical_page = require_int("logical page", logical_page)
    if not 0 <= logical_page < row.shape[0]:
        raise refusals.logical_page_out_of_range(logical_page, row.shape[0])
    return logical_page


def ensure_row_writable(row: TableRow, pool: BlockPool, logical_page: object) -> CopyOnWrite:
    """Map `logical_page` to a page only this row holds (allocate or copy-on-write)."""
    index = require_logical_page(row, logical_page)
    entry = int(row[index])
    action = pool.writable(None if entry == INVALID_BLOCK else entry)
    row[index] = action.destination if isinstance(action, Copy) else action.page
    return action


def install_row_prefix(row: TableRow, pool: BlockPool, pages: npt.NDArray[np.uint32]) -> None:
    """Map `pages` (distinct page ids) as the row's first entries, retaining each: all or nothing."""
    count = pages.shape[0]
    if count > row.shape[0]:
        raise refusals.prefix_too_long(count, row.shape[0])
    if not is_clear(row):
        raise refusals.prefix_target_not_empty()
    retain_array(pool, pages)
    row[:count] = pages


def mapped_run(row: TableRow) -> int | None:
    """How many logical pages are mapped, when they are exactly the first ones (else None)."""
    count = mapped_prefix(row)
    return None if count < 0 else int(count)


def append_row_shared(
    row: TableRow, pool: BlockPool, pages: Sequence[int] | npt.NDArray[np.int64], start: int | None = None
) -> None:
    """The spec's `append_shared` on a row: map `pages` right after its mapped leading run
    (`start`, when the caller has it), retaining each, all or nothing, with the spec's errors
    in its order."""
    start = mapped_run(row) if start is None else start
    if start is None:
        raise refusals.prefix_target_not_empty()
    if start + len(pages) > row.shape[0]:
        raise refusals.prefix_too_long(start + len(pages), row.shape[0])
    if not isinstance(pages, np.ndarray) and all(type(page) is int and 0 <= page <= U32_MAX for page in pages):
        pages = np.asarray(pages, dtype=np.int64)  # plain page ids: the kernels' path
    if isinstance(pages, np.ndarray) and pages.dtype == np.int64:
        if repeats_in(pages, row, start):
            raise refusals.repeated_page(tuple(pages.tolist()))
        retain_array(pool, pages)
    else:
        listed = list(pages)
        if repeats_a_page(tuple(listed) + tuple(row[:start].tolist())):
            raise refusals.repeated_page(tuple(listed))
        retain_sequence(pool, listed)
    row[start : start + len(pages)] = pages


def fork_row(source: TableRow, target: TableRow, pool: BlockPool) -> None:
    """Share every page of `source` with the empty `target` (one more reference each)."""
    if source.shape[0] != target.shape[0]:
        raise refusals.fork_width_mismatch(source.shape[0], target.shape[0])
    if not is_clear(target):
        raise refusals.fork_target_not_empty()
    retain_array(pool, source, skip_invalid=True)
    target[:] = source


def release_row(row: TableRow, pool: BlockPool) -> None:
    """Release every mapped page in logical order and clear the row: all or nothing."""
    release_array(pool, row, skip_invalid=True)
    clear_row(row)


class SequenceBlockTable:
    """One sequence's logical-page ownership; capacity is fixed at construction.

    Complexity: `get` and `ensure_writable` O(1); `install_shared_prefix`, `fork_into`,
    `release_all`, `entries` and `to_spec` O(logical pages). Storage is one uint32 row allocated
    at construction. Every operation is atomic: on an error the table and the pool are unchanged.
    """

    __slots__ = ("_row",)

    def __init__(self, logical_pages: int) -> None:
        logical_pages = require_size("logical_pages", logical_pages, 1, U32_MAX)
        self._row: TableRow = np.full(logical_pages, INVALID_BLOCK, dtype=np.uint32)

    @property
    def logical_pages(self) -> int:
        """The table's fixed capacity."""
        return int(self._row.shape[0])

    @property
    def state(self) -> Table:
        """The abstract state (`to_spec()`)."""
        return self.to_spec()

    def to_spec(self) -> Table:
        """The abstraction function: this table as the spec's `Table`."""
        return to_spec_table(self._row)

    def entries(self) -> Table:
        """Every entry, `None` where unmapped."""
        return to_spec_table(self._row)

    def get(self, logical_page: int) -> int | None:
        """The physical page behind `logical_page`, or None when unmapped or out of range."""
        index = as_int(logical_page)
        if index is None or not 0 <= index < self._row.shape[0]:
            return None
        entry = int(self._row[index])
        return None if entry == INVALID_BLOCK else entry

    def ensure_writable(self, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        """Make `logical_page` exclusively owned (allocate when unmapped, copy when shared)."""
        return ensure_row_writable(self._row, pool, logical_page)

    def fork_into(self, target: SequenceBlockTable, pool: BlockPool) -> None:
        """Share every mapped page with the empty `target`."""
        if not isinstance(target, SequenceBlockTable):
            raise refusals.wrong_kind("fork target", "SequenceBlockTable", target)
        fork_row(self._row, target._row, pool)

    def install_shared_prefix(self, pages: Sequence[int], pool: BlockPool) -> None:
        """Map `pages` as this empty table's first logical pages, retaining each: all or nothing."""
        pages = tuple(pages)
        if len(pages) > self._row.shape[0]:
            raise refusals.prefix_too_long(len(pages), self._row.shape[0])
        if not is_clear(self._row):
            raise refusals.prefix_target_not_empty()
        if repeats_a_page(pages):
            raise refusals.repeated_page(pages)
        retain_sequence(pool, pages)
        self._row[: len(pages)] = [require_int("page id", page) for page in pages]

    def release_all(self, pool: BlockPool) -> None:
        """Release every mapped page and clear the table."""
        release_row(self._row, pool)

    def __repr__(self) -> str:
        return f"SequenceBlockTable({self.to_spec()!r})"


def get_row(table: SequenceBlockTable) -> TableRow:
    """The table's storage, for impl's prefix store only."""
    return table._row
