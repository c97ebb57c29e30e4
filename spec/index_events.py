"""The router's index's public operations as events (`kvsched.spec.router_index`).

Each event names one call on an index and makes it (`perform`), so `kvsched.spec.step.apply` runs
it on the spec's `RouterIndex`, impl's, or any object with the same API. Arguments are whatever a
transport may deliver, in order or not: the index must name what it did, or refuse what is
malformed and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Deliver:
    """`index.fold(source, batch)`: a batch arrives on `source`'s stream."""

    source: Any
    batch: Any

    def perform(self, index: Any) -> Any:
        return index.fold(self.source, self.batch)


@dataclass(frozen=True, slots=True)
class Resync:
    """`index.resync(source, snapshot)`: a snapshot arrives on `source`'s stream."""

    source: Any
    snapshot: Any

    def perform(self, index: Any) -> Any:
        return index.resync(self.source, self.snapshot)


@dataclass(frozen=True, slots=True)
class LongestPrefix:
    """`index.longest_prefix(engine, keys)` (a query)."""

    engine: Any
    keys: Any

    def perform(self, index: Any) -> Any:
        return index.longest_prefix(self.engine, self.keys)


@dataclass(frozen=True, slots=True)
class Route:
    """`index.route(keys)` (a query)."""

    keys: Any

    def perform(self, index: Any) -> Any:
        return index.route(self.keys)


IndexEvent = Deliver | Resync | LongestPrefix | Route
INDEX_EVENTS: tuple[type[Any], ...] = IndexEvent.__args__
