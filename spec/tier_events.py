"""The tiered cache's public operations as events (`kvsched.spec.tiers`).

Each event names one call on a tiered cache and makes it (`perform`), so `kvsched.spec.step.apply`
runs it on the spec's `TieredCache`, impl's, or any object with the same API. Arguments are
whatever a caller may pass, in range or not: the cache must refuse what is wrong and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LookupKeys:
    """`cache.lookup(keys)`: the device run, then the host run (a query)."""

    keys: Any

    def perform(self, cache: Any) -> Any:
        return cache.lookup(self.keys)


@dataclass(frozen=True, slots=True)
class Commit:
    """`cache.commit(request_id, keys, match)`: admit with what an earlier lookup found."""

    request_id: Any
    keys: Any
    match: Any = None

    def perform(self, cache: Any) -> Any:
        return cache.commit(self.request_id, self.keys, self.match)


@dataclass(frozen=True, slots=True)
class Compute:
    """`cache.compute(request_id)`: the request's forward pass (what it read is returned)."""

    request_id: Any

    def perform(self, cache: Any) -> Any:
        return cache.compute(self.request_id)


@dataclass(frozen=True, slots=True)
class FreeRequest:
    """`cache.free(request_id)`: a finish, a cancel or a preemption."""

    request_id: Any

    def perform(self, cache: Any) -> Any:
        return cache.free(self.request_id)


@dataclass(frozen=True, slots=True)
class Demote:
    """`cache.demote(n)`: copy up to `n` cached device pages to the host."""

    n: Any

    def perform(self, cache: Any) -> Any:
        return cache.demote(self.n)


@dataclass(frozen=True, slots=True)
class Complete:
    """`cache.complete(transfer_id, ok)`: a copy completes, or fails."""

    transfer_id: Any
    ok: Any = True

    def perform(self, cache: Any) -> Any:
        return cache.complete(self.transfer_id, self.ok)


@dataclass(frozen=True, slots=True)
class TakeLease:
    """`cache.lease(page)`: an asynchronous reader holds a device page."""

    page: Any

    def perform(self, cache: Any) -> Any:
        return cache.lease(self.page)


@dataclass(frozen=True, slots=True)
class EndLease:
    """`cache.end_lease(lease_id)`: the reader reads its page and lets go."""

    lease_id: Any

    def perform(self, cache: Any) -> Any:
        return cache.end_lease(self.lease_id)


TierEvent = LookupKeys | Commit | Compute | FreeRequest | Demote | Complete | TakeLease | EndLease
TIER_EVENTS: tuple[type[Any], ...] = TierEvent.__args__
