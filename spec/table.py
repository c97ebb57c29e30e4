"""One request's logical page table: which physical page backs each logical page.

Modelled: a fixed-capacity tuple of entries, `None` for an unmapped logical page. The table
holds one pool reference on every page it maps; installing, forking and releasing move those
references, all or nothing.

    token t  ->  logical page t // page_size  ->  table[t // page_size] = physical page
                                                     row t % page_size inside it
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsched.spec import pool as pool_ops
from kvsched.spec import refusals
from kvsched.spec.batch import INVALID_BLOCK, U32_MAX
from kvsched.spec.domain import as_int, require_int, require_size
from kvsched.spec.pool import BlockPool, CopyOnWrite, PoolState

Table = tuple[int | None, ...]


def empty_table(logical_pages: int) -> Table:
    """A table of `logical_pages` unmapped entries."""
    return (None,) * require_size("logical_pages", logical_pages, 1, U32_MAX)


def is_empty_table(table: Table) -> bool:
    """No logical page is mapped."""
    return all(entry is None for entry in table)


def get_mapped_pages(table: Table) -> tuple[int, ...]:
    """The mapped physical pages, in logical order."""
    return tuple(entry for entry in table if entry is not None)


def to_abi(table: Table) -> tuple[int, ...]:
    """The table as the u32 entries a kernel reads (`INVALID_BLOCK` where unmapped)."""
    return tuple(INVALID_BLOCK if entry is None else entry for entry in table)


def require_logical_page(table: Table, logical_page: object) -> int:
    """`logical_page` as an index into `table`, or `InvalidArgument` / `OutOfRange`."""
    logical_page = require_int("logical page", logical_page)
    if not 0 <= logical_page < len(table):
        raise refusals.logical_page_out_of_range(logical_page, len(table))
    return logical_page


def ensure_writable(table: Table, pool: PoolState, logical_page: int) -> tuple[Table, PoolState, CopyOnWrite]:
    """Map `logical_page` to a page only this table holds (allocate or copy-on-write)."""
    index = require_logical_page(table, logical_page)
    pool, action = pool_ops.writable(pool, table[index])
    page = action.destination if isinstance(action, pool_ops.Copy) else action.page
    return table[:index] + (page,) + table[index + 1 :], pool, action


def retain_all(pool: PoolState, pages: Sequence[int]) -> PoolState:
    """Retain every page, or (by raising) none of them."""
    for page in pages:
        pool = pool_ops.retain(pool, page)
    return pool


def release_all(table: Table, pool: PoolState) -> tuple[Table, PoolState]:
    """Release every mapped page; the table becomes empty."""
    for page in get_mapped_pages(table):
        pool = pool_ops.release(pool, page)
    return (None,) * len(table), pool


def fork(source: Table, target: Table, pool: PoolState) -> tuple[Table, PoolState]:
    """Share every page of `source` with the empty `target` (one more reference each)."""
    if len(source) != len(target):
        raise refusals.fork_width_mismatch(len(source), len(target))
    if not is_empty_table(target):
        raise refusals.fork_target_not_empty()
    return source, retain_all(pool, get_mapped_pages(source))


def repeats_a_page(pages: Sequence[object]) -> bool:
    """Some page appears twice (values that cannot be pages are left to the pool to refuse)."""
    try:
        return len(set(pages)) != len(pages)
    except TypeError:
        return False


def install_shared_prefix(table: Table, pool: PoolState, pages: Sequence[int]) -> tuple[Table, PoolState]:
    """Map `pages` as the table's first logical pages, retaining each: all or nothing.

    A denied or stale prefix cannot partially mutate request state: if any retain fails, no
    reference was taken and the table is unchanged. A page may not appear twice (one page
    cannot hold two positions, as `PrefixPageSet` also requires): `InvalidArgument`, before
    any retain.
    """
    pages = tuple(pages)
    if len(pages) > len(table):
        raise refusals.prefix_too_long(len(pages), len(table))
    if not is_empty_table(table):
        raise refusals.prefix_target_not_empty()
    if repeats_a_page(pages):
        raise refusals.repeated_page(pages)
    pool = retain_all(pool, pages)  # refuses any page that is not an integer
    return tuple(require_int("page id", page) for page in pages) + table[len(pages) :], pool


def mapped_run(table: Table) -> int | None:
    """How many logical pages are mapped, when they are exactly the first ones (else None)."""
    count = len(get_mapped_pages(table))
    return count if all(entry is not None for entry in table[:count]) else None


def append_shared(table: Table, pool: PoolState, pages: Sequence[int]) -> tuple[Table, PoolState]:
    """Map `pages`, retaining each, right after the table's mapped leading run: all or nothing.

    The table must map exactly its first logical pages (`TargetNotEmpty` otherwise) and have
    room (`OutOfRange`); no page may repeat or be mapped already (`InvalidArgument`).
    """
    pages = tuple(pages)
    start = mapped_run(table)
    if start is None:
        raise refusals.prefix_target_not_empty()
    if start + len(pages) > len(table):
        raise refusals.prefix_too_long(start + len(pages), len(table))
    if repeats_a_page(pages + get_mapped_pages(table)):
        raise refusals.repeated_page(pages)
    pool = retain_all(pool, pages)
    ids = tuple(require_int("page id", page) for page in pages)
    return table[:start] + ids + table[start + len(pages) :], pool


class SequenceBlockTable:
    """One sequence's logical-page ownership; capacity is fixed at construction."""

    __slots__ = ("_entries",)

    def __init__(self, logical_pages: int) -> None:
        self._entries = empty_table(logical_pages)

    @property
    def state(self) -> Table:
        """The entries (a frozen value)."""
        return self._entries

    def commit(self, entries: Table) -> None:
        """Install entries produced by a spec transition."""
        self._entries = entries

    def entries(self) -> Table:
        """Every entry, `None` where unmapped."""
        return self._entries

    def get(self, logical_page: int) -> int | None:
        """The physical page behind `logical_page`, or None when unmapped or out of range."""
        index = as_int(logical_page)
        if index is None or not 0 <= index < len(self._entries):
            return None
        return self._entries[index]

    def ensure_writable(self, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        """Make `logical_page` exclusively owned; see `ensure_writable`."""
        entries, pool_state, action = ensure_writable(self._entries, pool.state, logical_page)
        self._entries = entries
        pool.commit(pool_state)
        return action

    def fork_into(self, target: SequenceBlockTable, pool: BlockPool) -> None:
        """Share every mapped page with the empty `target`."""
        if not isinstance(target, SequenceBlockTable):
            raise refusals.wrong_kind("fork target", "SequenceBlockTable", target)
        entries, pool_state = fork(self._entries, target._entries, pool.state)
        target._entries = entries
        pool.commit(pool_state)

    def install_shared_prefix(self, pages: Sequence[int], pool: BlockPool) -> None:
        """Install a shared prefix into this empty table, all or nothing."""
        entries, pool_state = install_shared_prefix(self._entries, pool.state, pages)
        self._entries = entries
        pool.commit(pool_state)

    def release_all(self, pool: BlockPool) -> None:
        """Release every mapped page and clear the table."""
        entries, pool_state = release_all(self._entries, pool.state)
        self._entries = entries
        pool.commit(pool_state)
