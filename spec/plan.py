"""The write plan: what a batched `ensure_writable` did, step by step, in spec and impl alike.

`ensure_writable_batch` and `prepare_decode_round` return a `WritePlan`: one step per
(request, logical page) pair, in step order, each with the action the single
`ensure_writable` call would have returned. It reads as the sequence of those actions; besides
them it tells which request slot and logical page each step wrote (`targets`) and which pages
to copy before any write (`copies`). impl returns a subclass that keeps the steps in arrays; a
plan compares equal to any plan with the same steps, whichever implementation made it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

from kvsched.spec.pool import Copy, CopyOnWrite


class WritePlan(Sequence[CopyOnWrite]):
    """The steps of one batched call: `actions()[i]` was done for `targets()[i]`."""

    __slots__ = ("_actions", "_targets")

    def __init__(self, targets: Sequence[tuple[int, int]] = (), actions: Sequence[CopyOnWrite] = ()) -> None:
        self._targets = tuple(targets)
        self._actions = tuple(actions)

    def actions(self) -> tuple[CopyOnWrite, ...]:
        """Each step's action, in step order."""
        return self._actions

    def targets(self) -> tuple[tuple[int, int], ...]:
        """Each step's (request slot, logical page), in step order."""
        return self._targets

    def copies(self) -> tuple[Copy, ...]:
        """The copies to run before any write, in step order."""
        return tuple(action for action in self.actions() if isinstance(action, Copy))

    def __len__(self) -> int:
        return len(self.actions())

    @overload
    def __getitem__(self, index: int) -> CopyOnWrite: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[CopyOnWrite, ...]: ...

    def __getitem__(self, index: int | slice) -> CopyOnWrite | tuple[CopyOnWrite, ...]:
        return self.actions()[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WritePlan):
            return NotImplemented
        return self.actions() == other.actions() and self.targets() == other.targets()

    __hash__ = None  # type: ignore[assignment]  # impl's plans are views of mutable buffers

    def __repr__(self) -> str:
        return f"WritePlan(targets={self.targets()!r}, actions={self.actions()!r})"


def pages_needed(steps: Sequence[tuple[tuple[int, int], int | None]], holders: Callable[[int], int]) -> int:
    """How many new pages a batch of steps needs, each step a target (slot, logical page) and the
    page it maps now (None: unmapped), with `holders(page)` its reference count before the batch.

    A step needs a page when its target is unmapped or shared. Steps see the earlier ones: a
    copy leaves its source with one holder fewer (a later sharer may find it its own), and a
    target written once is the request's own for any later step."""
    written: set[tuple[int, int]] = set()
    copied: dict[int, int] = {}
    needed = 0
    for target, page in steps:
        if target in written:
            continue
        written.add(target)
        if page is None:
            needed += 1
        elif holders(page) - copied.get(page, 0) > 1:
            needed += 1
            copied[page] = copied.get(page, 0) + 1
    return needed
