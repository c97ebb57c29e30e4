"""The evictable reserve (`kvsched.spec.reserve`) in constant time per page.

The free queue is an `OrderedDict` (pop from the front, park at the back, put at the front,
remove from the middle: each O(1)). The registrations are indexed both ways, shaped for the
common case of one page per key and one key per page: a key's first page (what `lookup`
answers) with a list of its later pages, and a page's first key with its sequence number, with a
list of its later keys and theirs; the sequence numbers give `to_spec` the order of all. A call
checks its input before it changes anything, except a release, which puts back the counts it
had lowered when a later page is refused; either way a refused call changes nothing.
`to_spec()` is the abstraction function: the spec state this object stands for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from itertools import islice

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
        # The lowest page from which none is reserved, when the reserved pages are the lowest ones
        # (vLLM's null block is page 0): one comparison then checks a batch against both.
        prefix = set(range(len(self.reserved))) == self.reserved
        self._ordinary_from = len(self.reserved) if prefix else pages
        self.queue: OrderedDict[int, None] = OrderedDict(
            (page, None) for page in range(pages) if page not in self.reserved
        )
        # By key: the first page registered under it, and those registered after it, in order.
        self._first_page: dict[Key, int] = {}
        self._later_pages: dict[Key, list[int]] = {}
        # By page: the first key registered on it and that registration's sequence number, and
        # the keys registered on it after the first, in order, each with its sequence number.
        self._first_key: dict[int, Key] = {}
        self._first_seq: dict[int, int] = {}
        self._later_keys: dict[int, list[tuple[Key, int]]] = {}
        self._registered = 0
        # Each key's first page, what `lookup` answers (read in place by a caller on its hot
        # path; only the reserve changes it).
        self.page_by_key: Mapping[Key, int] = self._first_page

    def _page(self, page: object) -> int:
        if type(page) is int and 0 <= page < self.pages:
            return page
        page = require_int("page id", page)
        if not 0 <= page < self.pages:
            raise refusals.page_out_of_range(page, self.pages)
        return page

    # -- queries -------------------------------------------------------------------------------

    def lookup(self, key: Key) -> int | None:
        return self._first_page.get(key)  # the first registered

    def pages_of(self, key: Key) -> tuple[int, ...]:
        first = self._first_page.get(key)
        if first is None:
            return ()
        return (first, *self._later_pages.get(key, ()))

    def is_cached(self, page: int) -> bool:
        return page in self._first_key

    def keys_of(self, page: int) -> tuple[Key, ...]:
        first = self._first_key.get(page)
        if first is None:
            return ()
        return (first, *[key for key, _ in self._later_keys.get(page, ())])

    def ref_count(self, page: int) -> int:
        return self.refs[self._page(page)]

    def free_count(self) -> int:
        return len(self.queue)

    def to_spec(self) -> ReserveState:
        made = [(self._first_seq[page], page, key) for page, key in self._first_key.items()]
        made += [(seq, page, key) for page, later in self._later_keys.items() for key, seq in later]
        made.sort(key=lambda registration: registration[0])
        entries = tuple((key, page) for _, page, key in made)
        return ReserveState(tuple(self.refs), tuple(self.queue), entries, tuple(sorted(self.reserved)), self.caching)

    # -- transitions ---------------------------------------------------------------------------

    def _drop_keys(self, page: int) -> tuple[Key, ...]:
        first = self._first_key.pop(page, None)
        if first is None:
            return ()
        del self._first_seq[page]
        later = self._later_keys.pop(page, None)
        keys = (first,) if later is None else (first, *[key for key, _ in later])
        first_page, later_pages = self._first_page, self._later_pages
        for key in keys:
            pages = later_pages.get(key)
            if pages is None:  # the key's only page
                del first_page[key]
                continue
            if first_page[key] == page:
                first_page[key] = pages.pop(0)  # the next registered becomes the key's hit
            else:
                pages.remove(page)
            if not pages:
                del later_pages[key]
        return keys

    def allocate(self, n: int) -> tuple[int, ...]:
        if type(n) is not int or n < 0:
            n = require_size("pages to allocate", n, 0, MAX_PAGES)
        queue = self.queue
        if n > len(queue):
            raise refusals.not_enough_free(n, len(queue))
        if n == 1:  # decode's common case
            page = queue.popitem(False)[0]  # positional: a keyword costs as much as the pop
            self.refs[page] = 1
            if page in self._first_key:
                self._drop_keys(page)
            return (page,)
        taken = tuple(islice(queue, n))  # the front of the queue
        refs = self.refs
        cached = self._first_key
        for page in taken:
            del queue[page]
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
        if pages and set(map(type, pages)) == _INTS and min(pages) >= self._ordinary_from and max(pages) < self.pages:
            checked = pages  # ids of this pool, none reserved: the common case, checked in C
        else:
            checked = self._pages(pages)
            reserved = self.reserved
            if not reserved.isdisjoint(checked):
                checked = [page for page in checked if page not in reserved]
        refs = self.refs
        queue = self.queue
        revived: list[int] = []
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
        cached = {} if park_all or evict_first or not self.caching else self._first_key
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
            queue.move_to_end(page, False)
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
        if self.refs[page] == 0 or page in self.reserved:
            raise refusals.cache_free_page(page)
        seq = self._registered
        first_key = self._first_key.get(page)
        if first_key is None:  # the page's first key
            self._first_key[page] = key
            self._first_seq[page] = seq
        elif first_key == key:
            return  # registered already
        else:
            later = self._later_keys.get(page)
            if later is None:
                self._later_keys[page] = [(key, seq)]
            elif any(known == key for known, _ in later):
                return  # registered already
            else:
                later.append((key, seq))
        if self._first_page.setdefault(key, page) != page:  # the key names other pages first
            self._later_pages.setdefault(key, []).append(page)
        self._registered = seq + 1

    def forget(self, page: int) -> tuple[Key, ...]:
        return self._drop_keys(self._page(page))

    def reset(self) -> None:
        held = [page for page, count in enumerate(self.refs) if count and page not in self.reserved]
        if held:
            raise refusals.cache_in_use(held)
        for index in (self._first_page, self._later_pages, self._first_key, self._first_seq, self._later_keys):
            index.clear()
