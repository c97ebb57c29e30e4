"""The engine's waiting queue as a part: the requests not running, in the order they will run.

One FIFO (a deque) per priority, the highest priority first; a preempted request re-enters at
the front of its class (`push(front=True)`), a submitted one at the back. Pushing and popping
either end is O(1) (a new priority class costs O(classes)); a cancel is O(its class). With the
automatic prefix cache, a queued request's full pages' keys are kept beside it (hashed at
submit, or kept from its slot when it is preempted), tied to the entry they were kept with.

A step marks the queue when it begins (`mark`): the queue copies itself when the step first
changes it, a failed step puts that copy back (`undo`), and a step that ended lets it go
(`settle`). `to_spec()` is its part of the spec's `EngineState.queue`.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from typing import Any

from kvsched.spec.engine_state import Queued
from kvsched.spec.page_keys import Key


class WaitingQueue:
    """The queue; see the module docstring."""

    __slots__ = ("_before", "_classes", "_ids", "_keys", "_marked", "_priorities")

    def __init__(self) -> None:
        self._classes: dict[int, deque[Queued]] = {}  # priority -> its FIFO
        self._priorities: list[int] = []  # the classes' priorities, ascending
        self._ids: set[int] = set()  # the ids queued
        self._keys: dict[int, tuple[Queued, list[Key]]] = {}  # request id -> (its entry, its keys)
        self._marked = False  # a step is running: its first change copies the queue into `_before`
        self._before: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def to_spec(self) -> tuple[Queued, ...]:
        """The entries in the order they will run."""
        return tuple(entry for priority in reversed(self._priorities) for entry in self._classes[priority])

    def front(self) -> Queued | None:
        """The entry that runs next, if any."""
        return self._classes[self._priorities[-1]][0] if self._priorities else None

    def push(self, entry: Queued, *, front: bool, keys: list[Key] | None = None) -> None:
        """Queue `entry` at the front or the back of its class, with its pages' `keys` if known."""
        self._changing()
        priority = entry.request.priority
        entries = self._classes.get(priority)
        if entries is None:
            entries = self._classes[priority] = deque()
            insort(self._priorities, priority)
        if front:
            entries.appendleft(entry)
        else:
            entries.append(entry)
        self._ids.add(entry.request.request_id)
        if keys is not None:
            self._keys[entry.request.request_id] = (entry, keys)

    def pop_front(self) -> Queued:
        """Take the entry that runs next (its kept keys go with it)."""
        self._changing()
        entry = self._classes[self._priorities[-1]].popleft()
        self._left(entry.request.request_id)
        return entry

    def remove(self, request_id: int) -> None:
        """Take the queued `request_id` out, wherever it is."""
        self._changing()
        for priority, entries in self._classes.items():
            kept = deque(entry for entry in entries if entry.request.request_id != request_id)
            if len(kept) != len(entries):
                self._classes[priority] = kept
                break
        self._left(request_id)

    def kept_keys(self, entry: Queued) -> list[Key] | None:
        """The keys kept with `entry` (None: none, or kept with another entry of its id)."""
        kept = self._keys.get(entry.request.request_id)
        return kept[1] if kept is not None and kept[0] is entry else None

    # -- a step's mark ----------------------------------------------------------------------------

    def mark(self) -> None:
        """A step begins: `undo` puts the queue back as it is now."""
        self._marked, self._before = True, None

    def undo(self) -> None:
        """The step failed: the queue as it was at `mark`."""
        before = self._before
        if before is not None:
            classes, priorities, ids, keys = before
            self._classes, self._priorities, self._ids, self._keys = classes, priorities, ids, keys
        self.settle()

    def settle(self) -> None:
        """The step ended: nothing to put back."""
        self._marked, self._before = False, None

    def _changing(self) -> None:
        """Copy the queue before a marked step first changes it."""
        if self._marked and self._before is None:
            classes = {priority: deque(entries) for priority, entries in self._classes.items()}
            self._before = classes, list(self._priorities), set(self._ids), dict(self._keys)

    def _left(self, request_id: int) -> None:
        self._ids.discard(request_id)
        self._keys.pop(request_id, None)
        for priority in [p for p in self._priorities if not self._classes[p]]:
            del self._classes[priority]
            self._priorities.remove(priority)

    def __repr__(self) -> str:
        return f"WaitingQueue({len(self)} queued)"
