"""The evictable reserve: a pool whose free pages keep their cached content until reused.

This is the page pool of an engine whose prefix cache holds no reference (vLLM v1's
`BlockPool`): a page freed while it is cached stays findable by its keys until the pool hands
it out again. Modelled:

    refs     a reference count per page; the reserved pages (vLLM's null block 0) are held by
             the pool itself, once, forever
    queue    the free pages, front first; a page is on it once, exactly when its count is 0.
             Allocation takes from the front.
    entries  the cache's registrations `(key, page)` in the order they were made; a key may name
             several pages (two requests computed the same content) and a page may have several
             keys (a full-page key and the keys of its partial prefixes). A lookup answers the
             first page registered under the key.

The transitions, and what they mean for a cached page:

    allocate  take `n` pages from the front; a cached one is **evicted** (its keys dropped)
    touch     add a reference to each page; a free cached page is **revived** (leaves the queue)
    free      drop a reference to each page, in the caller's order; a page reaching 0 is
              **parked** at the back when cached (the oldest parked page is reused first),
              and put at the front when not (LIFO reuse of uncached pages; one call's pages
              keep their order)
    free_evict_first
              the same, but a page reaching 0 goes to the front cached or not, keys kept:
              its content is held elsewhere (another tier), so it is evicted before every
              parked page (vLLM 0.34's `free_blocks(..., evict_first=True)`)
    unpin     drop a reference; a page reaching 0 goes to the back, cached or not
    register  add the key to a held page; a registration already made changes nothing
    forget    drop every key of a page; a free page stays where it is on the queue
    reset     drop every key; refused (`CacheInUse`) while any page but the reserved is held

Publication: the caller registers a sequence's full pages under keys of their content, and a key
may cover tokens past its page's end (vLLM 0.33 and 0.34 with EAGLE: `num_hash_lookahead_tokens`
L, because the drafter's KV at a page's last position depends on the next L tokens). A page is
then published only once those tokens exist: the first `n` pages of a sequence of `t` known tokens
are publishable when `n * page_size + L <= t` (`publishable`), one step later than without
lookahead; a registration before it names content nobody has seen yet. The reserve's own
transitions do not change with L (it never sees tokens); a pool that publishes checks the rule.

Every transition is a pure function that returns the new state or raises with nothing
changed; `Reserve` stores the current state. `RESERVE_INVARIANTS` are the predicates every
state satisfies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from kvsched.spec import refusals
from kvsched.spec.domain import require_int, require_size
from kvsched.spec.pool import MAX_PAGES

Key = Hashable


@dataclass(frozen=True, slots=True)
class ReserveState:
    """Counts, the free queue (front first), the cache's registrations in order, and whether
    caching is on (off, every freed page goes to the front)."""

    refs: tuple[int, ...]
    queue: tuple[int, ...]
    entries: tuple[tuple[Key, int], ...] = ()
    reserved: tuple[int, ...] = (0,)
    caching: bool = True


@dataclass(frozen=True, slots=True)
class Freed:
    """Where a free call put the pages it freed: the front run and the back run, in order."""

    front: tuple[int, ...]
    back: tuple[int, ...]


def initial_reserve(pages: int, *, reserved: Sequence[int] = (0,), caching: bool = True) -> ReserveState:
    """A pool of `pages` pages; the reserved ones are held by the pool, the rest free in id order."""
    pages = require_size("pages", pages, 1, MAX_PAGES)
    kept = tuple(sorted({_require_page_of(pages, page) for page in reserved}))
    refs = tuple(1 if page in kept else 0 for page in range(pages))
    queue = tuple(page for page in range(pages) if page not in kept)
    return ReserveState(refs, queue, (), kept, caching)


def _require_page_of(pages: int, page: object) -> int:
    page = require_int("page id", page)
    if not 0 <= page < pages:
        raise refusals.page_out_of_range(page, pages)
    return page


def _require_page(state: ReserveState, page: object) -> int:
    return _require_page_of(len(state.refs), page)


def keys_of(state: ReserveState, page: int) -> tuple[Key, ...]:
    """The keys `page` is registered under, oldest first."""
    return tuple(key for key, cached in state.entries if cached == page)


def is_cached(state: ReserveState, page: int) -> bool:
    """`page` has at least one key."""
    return any(cached == page for _, cached in state.entries)


def lookup(state: ReserveState, key: Key) -> int | None:
    """The first page registered under `key`, or None."""
    return next((page for cached, page in state.entries if cached == key), None)


def free_count(state: ReserveState) -> int:
    """Pages allocation can hand out now: the whole queue, parked pages included."""
    return len(state.queue)


def _with_counts(state: ReserveState, counts: dict[int, int]) -> tuple[int, ...]:
    return tuple(counts.get(page, count) for page, count in enumerate(state.refs))


def _forget(entries: tuple[tuple[Key, int], ...], pages: set[int]) -> tuple[tuple[Key, int], ...]:
    return tuple(entry for entry in entries if entry[1] not in pages)


def allocate(state: ReserveState, n: int) -> tuple[ReserveState, tuple[int, ...]]:
    """The first `n` pages of the queue, one reference each; cached ones are evicted."""
    n = require_size("pages to allocate", n, 0, MAX_PAGES)
    if n > len(state.queue):
        raise refusals.not_enough_free(n, len(state.queue))
    taken = state.queue[:n]
    refs = _with_counts(state, dict.fromkeys(taken, 1))
    entries = _forget(state.entries, set(taken))
    return replace(state, refs=refs, queue=state.queue[n:], entries=entries), taken


def touch(state: ReserveState, pages: Sequence[int]) -> tuple[ReserveState, tuple[int, ...]]:
    """One more reference on each page; a free page leaves the queue (a cache hit revives it).
    A reserved page is held by the pool and stays as it is. The revived pages, in order."""
    counts: dict[int, int] = {}
    for page in pages:
        page = _require_page(state, page)
        if page in state.reserved:
            continue
        counts[page] = counts.get(page, state.refs[page]) + 1
    revived = tuple(page for page in counts if state.refs[page] == 0)
    queue = tuple(page for page in state.queue if page not in revived)
    return replace(state, refs=_with_counts(state, counts), queue=queue), revived


def _release(state: ReserveState, pages: Sequence[int], park: Callable[[int], bool]) -> tuple[ReserveState, Freed]:
    counts: dict[int, int] = {}
    front: list[int] = []
    back: list[int] = []
    for page in pages:
        page = _require_page(state, page)
        if page in state.reserved:
            continue
        count = counts.get(page, state.refs[page])
        if count == 0:
            raise refusals.double_release(page)
        counts[page] = count - 1
        if count == 1:
            (back if park(page) else front).append(page)
    queue = (*front, *state.queue, *back)
    return replace(state, refs=_with_counts(state, counts), queue=queue), Freed(tuple(front), tuple(back))


def free(state: ReserveState, pages: Sequence[int]) -> tuple[ReserveState, Freed]:
    """One reference less on each page, in order; a page reaching 0 is parked at the back when
    cached (and caching is on), put at the front otherwise. A reserved page stays held."""
    return _release(state, pages, lambda page: state.caching and is_cached(state, page))


def free_evict_first(state: ReserveState, pages: Sequence[int]) -> tuple[ReserveState, Freed]:
    """One reference less on each page, in order; a page reaching 0 goes to the front, cached or
    not (its keys kept: a hit still revives it until it is taken). A reserved page stays held."""
    return _release(state, pages, lambda page: False)


def unpin(state: ReserveState, pages: Sequence[int]) -> tuple[ReserveState, Freed]:
    """One reference less on each page; a page reaching 0 goes to the back, cached or not."""
    return _release(state, pages, lambda page: True)


def register(state: ReserveState, key: Key, page: int) -> ReserveState:
    """Find `page` by `key` from now on; the page must be held and not reserved."""
    page = _require_page(state, page)
    if page in state.reserved or state.refs[page] == 0:
        raise refusals.cache_free_page(page)
    if (key, page) in state.entries:
        return state
    return replace(state, entries=(*state.entries, (key, page)))


def publishable(pages: int, page_size: int, tokens: int, lookahead: int = 0) -> bool:
    """Whether a sequence's first `pages` full pages may be registered when `tokens` of it are
    known and each key also covers the `lookahead` tokens after its page."""
    return pages * page_size + lookahead <= tokens


def forget(state: ReserveState, page: int) -> tuple[ReserveState, tuple[Key, ...]]:
    """Drop every key of `page` (an explicit eviction); which keys it had, oldest first."""
    page = _require_page(state, page)
    return replace(state, entries=_forget(state.entries, {page})), keys_of(state, page)


def reset(state: ReserveState) -> ReserveState:
    """Drop every key; `CacheInUse` (nothing changed) while a page other than the reserved is held."""
    held = [page for page, count in enumerate(state.refs) if count and page not in state.reserved]
    if held:
        raise refusals.cache_in_use(held)
    return replace(state, entries=())


# -- what always holds -------------------------------------------------------------------------


def inv_queue_is_the_free_pages(state: ReserveState) -> bool:
    """The queue holds each page whose count is 0, once, and nothing else."""
    zero = {page for page, count in enumerate(state.refs) if count == 0}
    return len(set(state.queue)) == len(state.queue) and set(state.queue) == zero


def inv_reserved_held_once(state: ReserveState) -> bool:
    """A reserved page is held by the pool alone, is never free and has no key."""
    return all(state.refs[page] == 1 and not is_cached(state, page) for page in state.reserved)


def inv_counts_non_negative(state: ReserveState) -> bool:
    """No count is negative."""
    return all(count >= 0 for count in state.refs)


def inv_entries_distinct(state: ReserveState) -> bool:
    """A registration is made once, and names a page of the pool."""
    pages = len(state.refs)
    return len(set(state.entries)) == len(state.entries) and all(0 <= page < pages for _, page in state.entries)


RESERVE_INVARIANTS: tuple[Callable[[ReserveState], bool], ...] = (
    inv_queue_is_the_free_pages,
    inv_reserved_held_once,
    inv_counts_non_negative,
    inv_entries_distinct,
)


def check_reserve(state: ReserveState) -> list[str]:
    """The names of the invariants `state` breaks."""
    return [inv.__name__ for inv in RESERVE_INVARIANTS if not inv(state)]


class Reserve:
    """The object API over the transitions: each call commits the new state or raises with the
    state as it was."""

    def __init__(self, pages: int, *, reserved: Sequence[int] = (0,), caching: bool = True) -> None:
        self.state = initial_reserve(pages, reserved=reserved, caching=caching)

    def to_spec(self) -> ReserveState:
        """The state (the abstraction function is the identity here)."""
        return self.state

    def allocate(self, n: int) -> tuple[int, ...]:
        self.state, pages = allocate(self.state, n)
        return pages

    def touch(self, pages: Sequence[int]) -> tuple[int, ...]:
        self.state, revived = touch(self.state, pages)
        return revived

    def free(self, pages: Sequence[int]) -> Freed:
        self.state, freed = free(self.state, pages)
        return freed

    def free_evict_first(self, pages: Sequence[int]) -> Freed:
        self.state, freed = free_evict_first(self.state, pages)
        return freed

    def unpin(self, pages: Sequence[int]) -> Freed:
        self.state, freed = unpin(self.state, pages)
        return freed

    def register(self, key: Key, page: int) -> None:
        self.state = register(self.state, key, page)

    def forget(self, page: int) -> tuple[Key, ...]:
        self.state, keys = forget(self.state, page)
        return keys

    def reset(self) -> None:
        self.state = reset(self.state)

    def lookup(self, key: Key) -> int | None:
        return lookup(self.state, key)

    def ref_count(self, page: int) -> int:
        return self.state.refs[_require_page(self.state, page)]

    def free_count(self) -> int:
        return free_count(self.state)

    def is_cached(self, page: int) -> bool:
        return is_cached(self.state, page)
