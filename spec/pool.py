"""Physical KV pages: reference counts and a last-in-first-out free stack.

Modelled: a fixed set of physical pages, each with a reference count, and the stack of free
pages. A fresh pool hands out 0, 1, 2, ...; a page whose count drops to zero is pushed back and
is the next one handed out (LIFO reuse). Every owner of a page (a request's table, a prefix-store
entry, an external holder) holds exactly one reference.

Invariants kept (spec/invariants.py): a page is on the free stack iff its count is 0, the stack
has no duplicates, and free + held = total.

Transitions are pure functions of `(PoolState, event)` that return the new state or raise; the
`BlockPool` object only stores the current state, so a failed operation changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsched.spec import refusals
from kvsched.spec.batch import U32_MAX
from kvsched.spec.domain import as_int, require_int, require_size

MAX_PAGES = U32_MAX  # page ids are u32 and INVALID_BLOCK (2**32 - 1) is reserved


@dataclass(frozen=True, slots=True)
class PoolState:
    """Reference count per page and the free stack (top = last element)."""

    refs: tuple[int, ...]
    free: tuple[int, ...]
    max_references: int = U32_MAX


@dataclass(frozen=True, slots=True)
class Existing:
    """The page is already exclusively owned: write it in place."""

    page: int


@dataclass(frozen=True, slots=True)
class Allocated:
    """The logical page was unmapped: a fresh page now backs it."""

    page: int


@dataclass(frozen=True, slots=True)
class Copy:
    """The page was shared: copy `source` into the fresh `destination` before writing."""

    source: int
    destination: int


CopyOnWrite = Existing | Allocated | Copy


def initial_pool(physical_pages: int, max_references: int = U32_MAX) -> PoolState:
    """A pool whose stack hands out page 0 first."""
    physical_pages = require_size("physical_pages", physical_pages, 0, MAX_PAGES)
    max_references = require_size("max_references", max_references, 1, U32_MAX)
    free = tuple(reversed(range(physical_pages)))
    return PoolState(refs=(0,) * physical_pages, free=free, max_references=max_references)


def get_ref_count(state: PoolState, page: int) -> int | None:
    """The page's reference count, or None when the id is out of range."""
    index = as_int(page)
    if index is None or not 0 <= index < len(state.refs):
        return None
    return state.refs[index]


def _require_page(state: PoolState, page: object) -> int:
    page = require_int("page id", page)
    if not 0 <= page < len(state.refs):
        raise refusals.page_out_of_range(page, len(state.refs))
    return page


def _with_ref(state: PoolState, page: int, count: int) -> tuple[int, ...]:
    return state.refs[:page] + (count,) + state.refs[page + 1 :]


def can_allocate(state: PoolState) -> bool:
    """A free page is available."""
    return len(state.free) > 0


def allocate(state: PoolState) -> tuple[PoolState, int]:
    """Pop the top of the free stack and give it one reference."""
    if not can_allocate(state):
        raise refusals.no_free_page(len(state.refs))
    page = state.free[-1]
    return replace(state, refs=_with_ref(state, page, 1), free=state.free[:-1]), page


def retain(state: PoolState, page: int) -> PoolState:
    """Add one reference to a held page."""
    page = _require_page(state, page)
    count = state.refs[page]
    if count == 0:
        raise refusals.retain_free_page(page)
    if count >= state.max_references:
        raise refusals.reference_overflow(page, count)
    return replace(state, refs=_with_ref(state, page, count + 1))


def release(state: PoolState, page: int) -> PoolState:
    """Drop one reference; at zero the page goes back on top of the free stack."""
    page = _require_page(state, page)
    count = state.refs[page]
    if count == 0:
        raise refusals.double_release(page)
    free = state.free + (page,) if count == 1 else state.free
    return replace(state, refs=_with_ref(state, page, count - 1), free=free)


def writable(state: PoolState, current: int | None) -> tuple[PoolState, CopyOnWrite]:
    """Make `current` safe to write: allocate when unmapped, copy when shared.

    A shared page's copy is allocated *before* the source is released, so an exhausted pool
    refuses the copy and the request keeps its (shared, read-only) page.
    """
    if current is None:
        state, page = allocate(state)
        return state, Allocated(page)
    page = _require_page(state, current)
    count = state.refs[page]
    if count == 1:
        return state, Existing(page)
    if count == 0:
        raise refusals.write_free_page(page)
    state, destination = allocate(state)
    return release(state, page), Copy(page, destination)


class BlockPool:
    """Fixed-capacity physical-page allocator with reference counts.

    Ordering promise: pages are handed out 0, 1, 2, ... from a fresh pool and freed pages are
    reused last-in-first-out.
    """

    def __init__(self, physical_pages: int, *, max_references: int = U32_MAX) -> None:
        self._state = initial_pool(physical_pages, max_references)

    @property
    def state(self) -> PoolState:
        """The whole pool state (a frozen value)."""
        return self._state

    def commit(self, state: PoolState) -> None:
        """Install a state produced by a spec transition (used by the spec's other objects)."""
        self._state = state

    @property
    def physical_pages(self) -> int:
        """The number of physical pages."""
        return len(self._state.refs)

    def allocate(self) -> int:
        """Allocate the top free page with one reference."""
        self._state, page = allocate(self._state)
        return page

    def retain(self, page: int) -> None:
        """Add one reference to a held page."""
        self._state = retain(self._state, page)

    def release(self, page: int) -> None:
        """Drop one reference to a held page."""
        self._state = release(self._state, page)

    def ref_count(self, page: int) -> int | None:
        """The page's reference count (0 when free), or None when out of range."""
        return get_ref_count(self._state, page)

    def free_count(self) -> int:
        """The number of free pages."""
        return len(self._state.free)

    def writable(self, current: int | None) -> CopyOnWrite:
        """Make a page writable; see `writable`."""
        self._state, action = writable(self._state, current)
        return action

    def __repr__(self) -> str:
        return f"BlockPool(physical_pages={self.physical_pages}, free={self.free_count()})"
