"""The evictable reserve's public operations as events (`kvsched.spec.reserve`).

Each event names one call on a reserve and makes it (`perform`), so `kvsched.spec.step.apply` runs
it on the spec's `Reserve`, impl's, or any object with the same API. Arguments are whatever a
caller may pass, in range or not: the reserve must refuse what is wrong and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TakePages:
    """`reserve.allocate(n)`: the first `n` pages of the free queue (cached ones evicted)."""

    n: Any

    def perform(self, reserve: Any) -> Any:
        return reserve.allocate(self.n)


@dataclass(frozen=True, slots=True)
class Touch:
    """`reserve.touch(pages)`: one more reference on each (a free cached page is revived)."""

    pages: tuple[Any, ...]

    def perform(self, reserve: Any) -> Any:
        return reserve.touch(list(self.pages))


@dataclass(frozen=True, slots=True)
class FreePages:
    """`reserve.free(pages)`: one reference less on each, in order (a cached page is parked)."""

    pages: tuple[Any, ...]

    def perform(self, reserve: Any) -> Any:
        return reserve.free(list(self.pages))


@dataclass(frozen=True, slots=True)
class FreeEvictFirst:
    """`reserve.free_evict_first(pages)`: one reference less on each; a page at 0 goes to the
    front, cached or not (its content is held elsewhere: it is evicted first)."""

    pages: tuple[Any, ...]

    def perform(self, reserve: Any) -> Any:
        return reserve.free_evict_first(list(self.pages))


@dataclass(frozen=True, slots=True)
class Unpin:
    """`reserve.unpin(pages)`: one reference less on each; a page at 0 goes to the back."""

    pages: tuple[Any, ...]

    def perform(self, reserve: Any) -> Any:
        return reserve.unpin(list(self.pages))


@dataclass(frozen=True, slots=True)
class Register:
    """`reserve.register(key, page)`: the held `page` is found by `key` from now on."""

    key: Any
    page: Any

    def perform(self, reserve: Any) -> Any:
        return reserve.register(self.key, self.page)


@dataclass(frozen=True, slots=True)
class Forget:
    """`reserve.forget(page)`: drop every key of `page` (an explicit eviction)."""

    page: Any

    def perform(self, reserve: Any) -> Any:
        return reserve.forget(self.page)


@dataclass(frozen=True, slots=True)
class ResetReserve:
    """`reserve.reset()`: drop every key; refused while a page other than the reserved is held."""

    def perform(self, reserve: Any) -> Any:
        return reserve.reset()


@dataclass(frozen=True, slots=True)
class Lookup:
    """`reserve.lookup(key)`: the first page registered under `key` (a query)."""

    key: Any

    def perform(self, reserve: Any) -> Any:
        return reserve.lookup(self.key)


ReserveEvent = TakePages | Touch | FreePages | FreeEvictFirst | Unpin | Register | Forget | ResetReserve | Lookup
RESERVE_EVENTS: tuple[type[Any], ...] = ReserveEvent.__args__
