"""The evictable reserve (`kvsched.spec.reserve`) in constant time per page.

The free queue is an `OrderedDict` (pop from the front, park at the back, put at the front,
remove from the middle: each O(1)); the registrations are one ordered dict of `(key, page)`
pairs beside two indexes, pages by key and keys by page, each in registration order. Every
call checks its whole input before it changes anything, so a refused call changes nothing.
`to_spec()` is the abstraction function: the spec state this object stands for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvsched.spec import refusals
from kvsched.spec.domain import require_int, require_size
from kvsched.spec.pool import MAX_PAGES
from kvsched.spec.reserve import Freed, Key, ReserveState


class Reserve:
    """Counts, free queue and cache registrations of one pool; see `kvsched.spec.reserve`."""

    def __init__(self, pages: int, *, reserved: Sequence[int] = (0,), caching: bool = True) -> None:
        pages = require_size("pages", pages, 1, MAX_PAGES)
        self.pages = pages
        self.reserved = frozenset(self._page(page) for page in reserved)
        self.caching = caching
        self.refs = [1 if page in self.reserved else 0 for page in range(pages)]
        self.queue: OrderedDict[int, None] = OrderedDict(
            (page, None) for page in range(pages) if page not in self.reserved
        )
        self._entries: dict[tuple[Key, int], None] = {}
        self._by_key: dict[Key, dict[int, None]] = {}
        self._by_page: dict[int, dict[Key, None]] = {}

    def _page(self, page: object) -> int:
        if type(page) is int and 0 <= page < self.pages:
            return page
        page = require_int("page id", page)
        if not 0 <= page < self.pages:
            raise refusals.page_out_of_range(page, self.pages)
        return page

    # -- queries -------------------------------------------------------------------------------

    def lookup(self, key: Key) -> int | None:
        pages = self._by_key.get(key)
        return next(iter(pages)) if pages else None

    def is_cached(self, page: int) -> bool:
        return page in self._by_page

    def keys_of(self, page: int) -> tuple[Key, ...]:
        return tuple(self._by_page.get(page, ()))

    def ref_count(self, page: int) -> int:
        return self.refs[self._page(page)]

    def free_count(self) -> int:
        return len(self.queue)

    def to_spec(self) -> ReserveState:
        return ReserveState(
            tuple(self.refs), tuple(self.queue), tuple(self._entries), tuple(sorted(self.reserved)), self.caching
        )

    # -- transitions ---------------------------------------------------------------------------

    def _drop_keys(self, page: int) -> tuple[Key, ...]:
        keys = self._by_page.pop(page, None)
        if not keys:
            return ()
        for key in keys:
            del self._entries[(key, page)]
            pages = self._by_key[key]
            del pages[page]
            if not pages:
                del self._by_key[key]
        return tuple(keys)

    def allocate(self, n: int) -> tuple[int, ...]:
        if type(n) is not int or n < 0:
            n = require_size("pages to allocate", n, 0, MAX_PAGES)
        queue = self.queue
        if n > len(queue):
            raise refusals.not_enough_free(n, len(queue))
        taken = tuple(queue.popitem(last=False)[0] for _ in range(n))
        refs = self.refs
        cached = self._by_page
        for page in taken:
            refs[page] = 1
            if page in cached:
                self._drop_keys(page)
        return taken

    def touch(self, pages: Sequence[int]) -> None:
        checked = [self._page(page) for page in pages]
        refs = self.refs
        queue = self.queue
        reserved = self.reserved
        for page in checked:
            if page in reserved:
                continue
            if refs[page] == 0:
                del queue[page]
            refs[page] += 1

    def _check_release(self, pages: Sequence[int]) -> list[int]:
        """The pages as ints, or the spec's refusal for the first one that cannot be released."""
        refs = self.refs
        reserved = self.reserved
        counts: dict[int, int] = {}
        checked: list[int] = []
        for page in pages:
            page = self._page(page)
            checked.append(page)
            if page in reserved:
                continue
            count = counts.get(page, refs[page])
            if count == 0:
                raise refusals.double_release(page)
            counts[page] = count - 1
        return checked

    def _release(self, pages: Sequence[int], park_all: bool) -> Freed:
        checked = self._check_release(pages)
        refs = self.refs
        reserved = self.reserved
        cached = self._by_page
        park_cached = self.caching
        front: list[int] = []
        back: list[int] = []
        for page in checked:
            if page in reserved:
                continue
            count = refs[page] - 1
            refs[page] = count
            if count == 0:
                if park_all or (park_cached and page in cached):
                    back.append(page)
                else:
                    front.append(page)
        queue = self.queue
        for page in reversed(front):
            queue[page] = None
            queue.move_to_end(page, last=False)
        for page in back:
            queue[page] = None
        return Freed(tuple(front), tuple(back))

    def free(self, pages: Sequence[int]) -> Freed:
        return self._release(pages, park_all=False)

    def unpin(self, pages: Sequence[int]) -> Freed:
        return self._release(pages, park_all=True)

    def register(self, key: Key, page: int) -> None:
        page = self._page(page)
        if page in self.reserved or self.refs[page] == 0:
            raise refusals.cache_free_page(page)
        entry = (key, page)
        if entry in self._entries:
            return
        self._entries[entry] = None
        self._by_key.setdefault(key, {})[page] = None
        self._by_page.setdefault(page, {})[key] = None

    def forget(self, page: int) -> tuple[Key, ...]:
        return self._drop_keys(self._page(page))

    def reset(self) -> None:
        held = [page for page, count in enumerate(self.refs) if count and page not in self.reserved]
        if held:
            raise refusals.cache_in_use(held)
        self._entries.clear()
        self._by_key.clear()
        self._by_page.clear()
