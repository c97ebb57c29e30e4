"""The evictable reserve (`kvsched.spec.reserve`) in constant time per page.

The free queue is an `OrderedDict` (pop from the front, park at the back, put at the front,
remove from the middle: each O(1)); the registrations are two indexes, pages by key and keys by
page, each in registration order and holding each registration's sequence number. A call
checks its input before it changes anything, except a release, which puts back the counts it
had lowered when a later page is refused; either way a refused call changes nothing.
`to_spec()` is the abstraction function: the spec state this object stands for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from kvsched.spec import refusals
from kvsched.spec.domain import require_int, require_size
from kvsched.spec.errors import KvschedError
from kvsched.spec.pool import MAX_PAGES
from kvsched.spec.reserve import Freed, Key, ReserveState

_INTS = {int}


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
        # Each registration's sequence number, found by key then page and by page then key.
        self._by_key: dict[Key, dict[int, int]] = {}
        self._by_page: dict[int, dict[Key, int]] = {}
        self._registered = 0
        # The pages each key names, first registered first (what `lookup` answers, read in place
        # by a caller on its hot path; only the reserve changes it).
        self.pages_by_key: Mapping[Key, Mapping[int, int]] = self._by_key

    def _page(self, page: object) -> int:
        if type(page) is int and 0 <= page < self.pages:
            return page
        page = require_int("page id", page)
        if not 0 <= page < self.pages:
            raise refusals.page_out_of_range(page, self.pages)
        return page

    # -- queries -------------------------------------------------------------------------------

    def lookup(self, key: Key) -> int | None:
        for page in self._by_key.get(key, ()):
            return page  # the first registered
        return None

    def is_cached(self, page: int) -> bool:
        return page in self._by_page

    def keys_of(self, page: int) -> tuple[Key, ...]:
        return tuple(self._by_page.get(page, ()))

    def ref_count(self, page: int) -> int:
        return self.refs[self._page(page)]

    def free_count(self) -> int:
        return len(self.queue)

    def to_spec(self) -> ReserveState:
        made = sorted((seq, page, key) for page, keys in self._by_page.items() for key, seq in keys.items())
        entries = tuple((key, page) for _, page, key in made)
        return ReserveState(tuple(self.refs), tuple(self.queue), entries, tuple(sorted(self.reserved)), self.caching)

    # -- transitions ---------------------------------------------------------------------------

    def _drop_keys(self, page: int) -> tuple[Key, ...]:
        keys = self._by_page.pop(page, None)
        if not keys:
            return ()
        for key in keys:
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
        pop = queue.popitem
        taken = tuple([pop(last=False)[0] for _ in range(n)])
        refs = self.refs
        cached = self._by_page
        for page in taken:
            refs[page] = 1
            if page in cached:
                self._drop_keys(page)
        return taken

    def _pages(self, pages: Sequence[int]) -> Sequence[int]:
        """`pages`, when every one is an int id of this pool (the common case, one pass);
        otherwise the spec's refusal for the first that is not."""
        if not pages or (set(map(type, pages)) == _INTS and min(pages) >= 0 and max(pages) < self.pages):
            return pages  # checked in C: the common case
        return [self._page(page) for page in pages]

    def touch(self, pages: Sequence[int]) -> tuple[int, ...]:
        checked = self._pages(pages)
        refs = self.refs
        queue = self.queue
        reserved = self.reserved
        revived: list[int] = []
        if not reserved.isdisjoint(checked):
            checked = [page for page in checked if page not in reserved]
        for page in checked:
            count = refs[page]
            if count == 0:
                del queue[page]
                revived.append(page)
            refs[page] = count + 1
        return tuple(revived)

    def _release(self, pages: Sequence[int], park_all: bool, evict_first: bool = False) -> Freed:
        refs = self.refs
        n = self.pages
        reserved = self.reserved
        cached = {} if park_all or evict_first or not self.caching else self._by_page
        front: list[int] = []
        back: list[int] = []
        done: list[int] = []  # pages released so far: put back if a later one is refused
        for page in pages:
            if type(page) is not int or not 0 <= page < n:
                try:
                    page = self._page(page)  # a lossless int (numpy's) passes
                except KvschedError:
                    self._undo(done)
                    raise
            if page in reserved:
                continue
            count = refs[page]
            if count == 0:
                self._undo(done)
                raise refusals.double_release(page)
            refs[page] = count - 1
            done.append(page)
            if count == 1:
                if park_all or page in cached:
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

    def _undo(self, released: list[int]) -> None:
        refs = self.refs
        for page in released:
            refs[page] += 1

    def free(self, pages: Sequence[int]) -> Freed:
        return self._release(pages, park_all=False)

    def free_evict_first(self, pages: Sequence[int]) -> Freed:
        return self._release(pages, park_all=False, evict_first=True)

    def unpin(self, pages: Sequence[int]) -> Freed:
        return self._release(pages, park_all=True)

    def register(self, key: Key, page: int) -> None:
        if type(page) is not int or not 0 <= page < self.pages:
            page = self._page(page)
        if page in self.reserved or self.refs[page] == 0:
            raise refusals.cache_free_page(page)
        seq = self._registered
        pages = self._by_key.get(key)
        if pages is None:
            self._by_key[key] = {page: seq}
        elif page in pages:
            return
        else:
            pages[page] = seq
        keys = self._by_page.get(page)
        if keys is None:
            self._by_page[page] = {key: seq}
        else:
            keys[key] = seq
        self._registered = seq + 1

    def forget(self, page: int) -> tuple[Key, ...]:
        return self._drop_keys(self._page(page))

    def reset(self) -> None:
        held = [page for page, count in enumerate(self.refs) if count and page not in self.reserved]
        if held:
            raise refusals.cache_in_use(held)
        self._by_key.clear()
        self._by_page.clear()
