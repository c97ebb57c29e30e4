"""The engine's leases as a part: asynchronous readers' holds on pages (the spec's `lease`).

A lease holds one reference on each page it names until `end`, whatever happens to the request
whose pages they were. Ids are the least unused. Only `take` and `end` change it, never a step,
so a failed step has nothing of it to put back. `to_spec()` is the spec's `EngineState.leases`.
"""

from __future__ import annotations

from kvsched.impl.pool import BlockPool
from kvsched.spec import refusals
from kvsched.spec.domain import as_int
from kvsched.spec.engine_state import Leased


class Leases:
    """Lease id -> the pages it holds; see the module docstring."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, ...]] = {}

    def to_spec(self) -> tuple[Leased, ...]:
        """The leases, in id order."""
        return tuple(Leased(lease_id, pages) for lease_id, pages in sorted(self._held.items()))

    def take(self, pool: BlockPool, pages: tuple[int, ...]) -> int:
        """Hold `pages` (all or none); the new lease's id."""
        held = self._hold(pool, pages)
        lease_id = next(number for number in range(len(self._held) + 1) if number not in self._held)
        self._held[lease_id] = held
        return lease_id

    def end(self, pool: BlockPool, lease_id: object) -> None:
        """Release what lease `lease_id` holds (`UnknownLease` for an id not held, nothing changed)."""
        number = as_int(lease_id)
        if number is None or number not in self._held:
            raise refusals.unknown_lease(lease_id)
        for page in self._held.pop(number):
            pool.release(page)

    def _hold(self, pool: BlockPool, pages: tuple[int, ...]) -> tuple[int, ...]:
        """A reference on each of `pages`, all or none: the pages held."""
        taken: list[int] = []
        try:
            for page in pages:
                pool.retain(page)
                taken.append(page)
        except BaseException:
            for page in reversed(taken):
                pool.release(page)
            raise
        return pages

    def __repr__(self) -> str:
        return f"Leases({len(self._held)})"
