"""The host tier in impl's engine: copies between the tiers and the requests that wait for them,
the spec's `kvsched.spec.engine_host` over impl's parts.

    complete    take the copies the model reported: a completed promotion's page enters the
                cache, every copy's device hold is released, and a request whose promotion
                failed is named for preemption (`outcome`: what the report says of one copy)
    promote     a newcomer's host run: one promotion into each of its fresh pages, held until
                the copy completes; the request waits for them all (`waits`)
    readable    the slot of a running request that waits for no copy (`CopyPending` else)

The part holds no state of its own: the copies are the host tier's, the waits the running set's.
"""

from __future__ import annotations

from kvsched.impl.engine_running import RunningSet
from kvsched.impl.host_tier import HostTier
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.spec import refusals
from kvsched.spec.host_tier import PROMOTE, Copy
from kvsched.spec.page_keys import Key


class HostCopies:
    """The engine's copies between the tiers; see the module docstring."""

    __slots__ = ("cache", "host", "page_size", "pool", "running")

    def __init__(
        self, page_size: int, pool: BlockPool, cache: PrefixCache, host: HostTier, running: RunningSet
    ) -> None:
        self.page_size, self.pool, self.cache, self.host, self.running = page_size, pool, cache, host, running

    def complete(self, done: dict[int, bool]) -> list[int]:
        """Take the copies `done` reports (transfer id -> completed): the slots whose promotions
        failed, in the order they are preempted (the latest first: places kept)."""
        if not done:
            return []
        failed: list[int] = []
        for copy in list(self.host.copies.values()):
            ok = self.outcome(done, copy)
            if ok is None:
                continue
            if copy.kind == PROMOTE and ok:
                self.cache.insert(self.pool, [copy.key], [copy.page], [copy.depth], [copy.parent])
            self.pool.release(copy.page)
            self.host.complete(copy, ok)
            slot = self.running.slots.get(copy.request_id) if copy.request_id is not None else None
            waiting = self.running.waiting.get(slot, ()) if slot is not None else ()
            if slot is None or copy.transfer_id not in waiting:
                continue
            if ok:
                rest = tuple(tid for tid in waiting if tid != copy.transfer_id)
                if rest:
                    self.running.waiting[slot] = rest
                else:
                    del self.running.waiting[slot]
            elif slot not in failed:
                failed.append(slot)
        return sorted(failed, key=self.running.victim_order)

    def outcome(self, done: dict[int, bool], copy: Copy) -> bool | None:
        """What the model reported of `copy`: completed, failed, or None (still in flight)."""
        return done.get(copy.transfer_id)

    def promote(self, slot: int, request_id: int, pages: list[int], run: list[tuple[Key, int, int]]) -> None:
        """Promote the host run `run` into `slot`'s fresh `pages` (each held by its copy)."""
        waiting = []
        for page, (key, _, _) in zip(pages, run, strict=True):
            self.pool.retain(page)  # the copy's hold
            waiting.append(self.host.promote(key, page, request_id))
        self.host.count_hit(len(run) * self.page_size)
        self.running.waiting[slot] = tuple(waiting)

    def waits(self, slot: int) -> bool:
        """`slot`'s request waits for promotions (it computes nothing meanwhile)."""
        return slot in self.running.waiting

    def readable(self, request_id: int) -> int:
        """The slot of a running request that waits for no copy."""
        slot = self.running.slots.get(request_id)
        if slot is None:
            raise refusals.unknown_request(request_id)
        if slot in self.running.waiting:
            raise refusals.copy_pending(request_id, self.promoted_page(slot))
        return slot

    def promoted_page(self, slot: int) -> int:
        """A page `slot`'s request waits for."""
        return next(copy.page for copy in self.host.copies.values() if copy.transfer_id in self.running.waiting[slot])

    def __repr__(self) -> str:
        return f"HostCopies({len(self.host.copies)} in flight)"
