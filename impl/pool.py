"""Physical KV pages as struct-of-arrays: uint32 reference counts and an int32 free stack.

Refines `kvsched.spec.pool`: `to_spec()` is the abstraction function

    PoolState(refs = tuple(refs), free = tuple(free[:top]), max_references)

    free: [ p7 | p3 | p0 | .. | .. ]    the stack grows to the right; free[top - 1] is next
                         ^ top          entries at and above top are stale and never read

Representation invariant (checked by `kvsched.impl.refinement`): `free[:top]` holds exactly the
pages whose count is 0, once each. The stack is int64 only for pools above 2**31 pages, whose
ids do not fit int32. Every array is allocated at construction; no operation allocates or grows
storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from kvsched.impl import faults
from kvsched.impl.page_kernels import release_pages, retain_pages
from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import as_int, require_int, require_size
from kvsched.spec.errors import (
    KvschedError,
)
from kvsched.spec.pool import MAX_PAGES, Allocated, Copy, CopyOnWrite, Existing, PoolState

INT32_PAGES = 2**31  # a stack of at most this many pages fits int32 ids


class PoolArrays(NamedTuple):
    """The pool's storage, for impl's kernels only: writes outside `kvsched.impl` break refinement."""

    refs: npt.NDArray[np.uint32]  # [pages] reference count per page
    free: npt.NDArray[np.signedinteger[Any]]  # [pages] the free stack, valid below top[0]
    top: npt.NDArray[np.int64]  # [1] how many pages are free
    max_references: int


class BlockPool:
    """Fixed-capacity physical-page allocator with reference counts.

    Complexity: `allocate`, `retain`, `release`, `ref_count`, `free_count` and `writable` are O(1)
    and allocate nothing; construction and `to_spec` are O(pages).
    Ordering promise (the spec's): a fresh pool hands out 0, 1, 2, ...; freed pages are reused
    last-in-first-out; `writable` allocates a copy's destination before releasing its source.
    Not thread-safe.
    """

    __slots__ = ("_free", "_max_references", "_refs", "_top")

    def __init__(self, physical_pages: int, *, max_references: int = U32_MAX) -> None:
        physical_pages = require_size("physical_pages", physical_pages, 0, MAX_PAGES)
        max_references = require_size("max_references", max_references, 1, U32_MAX)
        stack_type = np.int32 if physical_pages <= INT32_PAGES else np.int64
        self._refs = np.zeros(physical_pages, dtype=np.uint32)
        self._free = cast(npt.NDArray[np.signedinteger[Any]], np.arange(physical_pages - 1, -1, -1, dtype=stack_type))
        self._top = np.array([physical_pages], dtype=np.int64)
        self._max_references = max_references

    @property
    def physical_pages(self) -> int:
        """The number of physical pages."""
        return int(self._refs.shape[0])

    @property
    def max_references(self) -> int:
        """The most references one page may have."""
        return self._max_references

    @property
    def state(self) -> PoolState:
        """The abstract state (`to_spec()`); O(pages)."""
        return self.to_spec()

    def to_spec(self) -> PoolState:
        """The abstraction function: this pool as the spec's `PoolState`."""
        top = int(self._top[0])
        return PoolState(tuple(self._refs.tolist()), tuple(self._free[:top].tolist()), self._max_references)

    def _require_page(self, page: object) -> int:
        if type(page) is int and 0 <= page < self._refs.shape[0]:
            return page
        page = require_int("page id", page)
        if not 0 <= page < self._refs.shape[0]:
            raise refusals.page_out_of_range(page, self._refs.shape[0])
        return page

    def allocate(self) -> int:
        """Allocate the top free page with one reference."""
        top = int(self._top[0])
        if top == 0:
            raise refusals.no_free_page(self._refs.shape[0])
        page = int(self._free[top - 1])
        self._top[0] = top - 1
        self._refs[page] = 1
        return page

    def retain(self, page: int) -> None:
        """Add one reference to a held page."""
        page = self._require_page(page)
        count = int(self._refs[page])
        if count == 0:
            raise refusals.retain_free_page(page)
        if self._at_maximum(count):
            raise refusals.reference_overflow(page, count)
        self._refs[page] = count + 1

    def _at_maximum(self, count: int) -> bool:
        """A page with `count` references takes no more."""
        return count >= self._max_references

    def release(self, page: int) -> None:
        """Drop one reference; at zero the page goes back on top of the free stack."""
        page = self._require_page(page)
        count = int(self._refs[page])
        if count == 0:
            raise refusals.double_release(page)
        self._refs[page] = count - 1
        if count == 1:
            self._push_free(page)

    def _push_free(self, page: int) -> None:
        """Put a page whose count reached 0 on top of the free stack."""
        top = int(self._top[0])
        self._free[top] = page
        self._top[0] = top + 1

    def ref_count(self, page: int) -> int | None:
        """The page's reference count (0 when free), or None when out of range."""
        index = as_int(page)
        if index is None or not 0 <= index < self._refs.shape[0]:
            return None
        return int(self._refs[index])

    def free_count(self) -> int:
        """The number of free pages."""
        return int(self._top[0])

    def writable(self, current: int | None) -> CopyOnWrite:
        """Make `current` safe to write: allocate when unmapped (None), copy when shared."""
        if current is None:
            return Allocated(self.allocate())
        page = self._require_page(current)
        count = int(self._refs[page])
        if count == 0:
            raise refusals.write_free_page(page)
        if not self._must_copy(count):
            return Existing(page)
        return self._copy(page, count)

    def _must_copy(self, count: int) -> bool:
        """A held page with `count` references is shared: writing it needs a copy."""
        return count > 1

    def _copy(self, page: int, count: int) -> Copy:
        """Copy-on-write of a shared page: allocate the copy first, so a refusal changes nothing;
        then drop this holder's reference to the source (which stays held)."""
        destination = self.allocate()
        self._refs[page] = count - 1
        return Copy(page, destination)

    def __repr__(self) -> str:
        return f"BlockPool(physical_pages={self.physical_pages}, free={self.free_count()})"


def get_arrays(pool: BlockPool) -> PoolArrays:
    """The pool's storage, for impl's kernels."""
    return PoolArrays(pool._refs, pool._free, pool._top, pool._max_references)


def _fault(pool: BlockPool, code: int, detail: int, page: int) -> KvschedError:
    # Kernel messages name the input page, which for a Python sequence may not fit any array.
    if code == faults.OVERFLOW:
        return faults.get_error(code, detail, physical_pages=pool.physical_pages, page=page)
    return faults.get_error(code, page, physical_pages=pool.physical_pages)


def retain_array(pool: BlockPool, pages: npt.NDArray[np.integer], skip_invalid: bool = False) -> None:
    """Retain every page of a page-id array in order, or (by raising the spec's error) none."""
    code, at, detail = retain_pages(pool._refs, pages, pages.shape[0], pool._max_references, skip_invalid)
    if code != faults.OK:
        raise _fault(pool, code, detail, int(pages[at]))


def release_array(pool: BlockPool, pages: npt.NDArray[np.integer], skip_invalid: bool = False) -> None:
    """Release every page of a page-id array in order, or (by raising the spec's error) none."""
    code, at, detail = release_pages(pool._refs, pool._free, pool._top, pages, pages.shape[0], skip_invalid)
    if code != faults.OK:
        raise _fault(pool, code, detail, int(pages[at]))


def retain_sequence(pool: BlockPool, pages: Sequence[object]) -> None:
    """Retain Python page ids in order, all or nothing, with the spec's errors and check order.

    An element that is not an int fails where the spec's `retain` would: after every earlier
    element was retained, so an earlier failing page still wins.
    """
    ids = np.empty(len(pages), dtype=np.int64)
    count = 0
    for page in pages:
        index = as_int(page)
        if index is None:
            break
        ids[count] = index if 0 <= index < pool.physical_pages else -1
        count += 1
    code, at, detail = retain_pages(pool._refs, ids, count, pool._max_references, False)
    if code != faults.OK:
        raise _fault(pool, code, detail, require_int("page id", pages[at]))
    if count < len(pages):
        release_pages(pool._refs, pool._free, pool._top, ids, count, False)  # undo: never reaches zero
        require_int("page id", pages[count])  # raises the spec's error
