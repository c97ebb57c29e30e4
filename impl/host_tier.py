"""The engine's host tier over mutable storage: the spec's `host_tier`, built for the engine's step.

Storage: the free stack (a list, top last); the cache as a dict key -> (page, depth, parent) in least
recently used order (a use moves the key to the end); the keys by cached page; the copies in
flight by id (issue order); how many copies read or write each host page; the keys being
demoted; the refused device pages (a list: few, in order of failure). A step's plan changes none
of it (its completions and promotions are its commit's); `to_spec()` is the abstraction function
to the spec's `HostState`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kvsched.spec.host_tier import DEMOTE, PROMOTE, Copy, HostPage, HostState, HostStats
from kvsched.spec.page_keys import Key

HIT_TOKENS, DEMOTED, PROMOTED, FAILED = range(4)
NOTHING_COUNTED = HostStats()


class HostTier:
    """Host pages, their cache and the copies in flight; see the module docstring."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self._free = list(reversed(range(pages)))
        self._cache: dict[Key, tuple[int, int, Key | None]] = {}  # key -> (page, depth, parent), LRU first
        self._keys: dict[int, Key] = {}  # cached page -> its key
        self.copies: dict[int, Copy] = {}  # id -> copy, issue order
        self._users: Counter[int] = Counter()  # host page -> copies naming it
        self._demoting: set[Key] = set()
        self.issued = 0
        self._stats = [0, 0, 0, 0]
        self.refused: list[int] = []  # device pages whose demotion failed, still cached on the device

    # -- the abstraction ------------------------------------------------------------------

    def to_spec(self) -> HostState:
        """The abstraction function: this tier as the spec's `HostState`."""
        cache = tuple(HostPage(page, key, depth, parent) for key, (page, depth, parent) in self._cache.items())
        return HostState(
            self.pages,
            tuple(self._free),
            cache,
            tuple(self.copies.values()),
            self.issued,
            HostStats(*self._stats),
            tuple(self.refused),
        )

    def counters(self) -> tuple[int, ...]:
        return tuple(self._stats)

    def since(self, counters: tuple[int, ...]) -> HostStats:
        """What the counters counted after `counters` were read."""
        if tuple(self._stats) == counters:
            return NOTHING_COUNTED
        return HostStats(*[now - then for now, then in zip(self._stats, counters, strict=True)])

    # -- reading ------------------------------------------------------------------------------

    def cached(self) -> Mapping[Key, tuple[int, int, Key | None]]:
        """The cache: key -> (host page, depth, parent), least recently used first (to read)."""
        return self._cache

    def run(self, keys: Sequence[Key]) -> list[tuple[Key, int, int]]:
        """(key, page, depth) of the host pages cached under `keys[0]`, `keys[1]`, ... up to
        the first key not cached."""
        found = []
        for key in keys:
            entry = self._cache.get(key)
            if entry is None:
                break
            found.append((key, entry[0], entry[1]))
        return found

    def wants(self, page: int, key: Key) -> bool:
        """The spec's `wants`: device `page`, cached under `key`, would be demoted rather than evicted."""
        if not self.pages or key in self._cache or key in self._demoting or page in self.refused:
            return False
        if self._free:
            return True
        read = {copy.host_page for copy in self.copies.values() if copy.kind == PROMOTE}
        return len(self._keys) > len(read & self._keys.keys())

    def device_holds(self) -> tuple[int, ...]:
        """The device pages the copies in flight hold, sorted."""
        return tuple(sorted(copy.page for copy in self.copies.values()))

    # -- changing -----------------------------------------------------------------------------

    def demote(self, page: int, key: Key, depth: int, parent: Key | None = None) -> Copy:
        """Copy device `page` to a host page (`wants(key)` holds); the copy issued."""
        if self._free:
            host_page = self._free.pop()
        else:  # the least recently used cached page no copy reads leaves the cache
            lru, (host_page, *_) = next(
                (key, entry) for key, entry in self._cache.items() if self._reclaimable(entry[0])
            )
            del self._cache[lru]
            del self._keys[host_page]
        copy = Copy(self.issued, DEMOTE, page, host_page, key, depth, parent=parent)
        self._issue(copy)
        self._demoting.add(key)
        self._stats[DEMOTED] += 1
        return copy

    def _reclaimable(self, host_page: int) -> bool:
        """A cached host page a demotion may take: no copy reads it."""
        return not self._users[host_page]

    def promote(self, key: Key, page: int, request_id: int) -> int:
        """Copy the host page cached under `key` into device `page` for `request_id`; its id.
        The key becomes the most recently used."""
        host_page, depth, parent = self._cache[key] = self._cache.pop(key)
        copy = Copy(self.issued, PROMOTE, page, host_page, key, depth, request_id, parent)
        self._issue(copy)
        self._stats[PROMOTED] += 1
        return copy.transfer_id

    def count_hit(self, tokens: int) -> None:
        self._stats[HIT_TOKENS] += tokens

    def complete(self, copy: Copy, ok: bool) -> None:
        """The spec's `complete`."""
        del self.copies[copy.transfer_id]
        page = copy.host_page
        self._users[page] -= 1
        if copy.kind == DEMOTE:
            self._demoting.discard(copy.key)
            if ok:
                self._cache[copy.key] = (page, copy.depth, copy.parent)
                self._keys[page] = copy.key
            else:
                self.refused.append(copy.page)
        elif not ok and self._keys.get(page) == copy.key:
            del self._cache[self._keys.pop(page)]
        if not ok:
            self._stats[FAILED] += 1
        if not self._users[page] and page not in self._keys:
            if ok:
                self._free.append(page)
            else:  # suspect: handed out after every other free page
                self._free.insert(0, page)

    def keep_refused(self, cached: Any) -> None:
        """Forget the refused pages the device cache no longer holds (`cached`: its page mask)."""
        self.refused = [page for page in self.refused if cached[page]]

    def reset(self) -> None:
        """Drop every cached page (no copy is in flight), least recently used freed first."""
        self._free += [page for page, *_ in self._cache.values()]
        self._cache.clear()
        self._keys.clear()
        self.refused.clear()

    def _issue(self, copy: Copy) -> None:
        self.copies[copy.transfer_id] = copy
        self._users[copy.host_page] += 1
        self.issued += 1

    def __repr__(self) -> str:
        return f"HostTier(pages={self.pages}, cached={len(self._cache)}, copies={len(self.copies)})"
