"""Safety mode's recurrent states: a hybrid manager's `Recurrent()` groups (Mamba, GDN, linear
attention), one state slot per live request in each, snapshots cached under keys.

The harness keeps a ghost state per slot: the context the state has consumed (its group, the
tenant under "tenants", and the request's tokens through the last position it absorbed). The
engine's pass advances a request's state in place, one position at a time; the copies the
manager asks for (`state_copies`: before the pass, then after it) move ghost states between
slots; after `accept` the engine picks the state its accepted tokens left.

Checked (each failure a `CheckFailed` of the kind named):
- GHOST: the query at position q > 0 finds, in the request's own state slot, the state after
  exactly positions 0 .. q - 1 of its own tokens and group: a hit resumes only from a snapshot of
  its own prefix (vLLM #53912's shape: a state snapshotted with drafts pending, under the accepted
  tokens' key, serves the drafts to the next hit). A snapshot's key names the state it was first
  seen cached over.
- EXCLUSIVE: a copy never writes into another live request's state slot.
- INVARIANT (`state_problems`, every view): each live request has one slot per recurrent group,
  in range, its own, neither free nor a snapshot's; a snapshot's slot is in range.
- LEAK (teardown): every slot is free or a snapshot's once every request is freed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvsched.spec.kv_layout import Group, Recurrent
from kvsched.testing.adapter import PoolView
from kvsched.testing.outcome import FailureKind

if TYPE_CHECKING:
    from kvsched.testing.safety import SafetyMachine

Context = tuple[int, ...]
Copies = Sequence[tuple[int, int]]


def recurrent_groups(groups: Sequence[Group]) -> tuple[int, ...]:
    """The indices of the recurrent groups, in order: `states[request]` has one slot for each."""
    return tuple(g for g, group in enumerate(groups) if isinstance(group, Recurrent))


def state_problems(view: PoolView, groups: Sequence[Group], live: Sequence[int]) -> list[str]:
    """What is wrong with a view's recurrent states (empty when nothing is, or no group is recurrent)."""
    recurrent = recurrent_groups(groups)
    if not recurrent:
        return []
    if set(view.states) != set(live):
        return [f"state slots for requests {sorted(view.states)}, but the live requests are {sorted(live)}"]
    problems: list[str] = []
    owner: dict[int, int] = {}
    for request_id, slots in sorted(view.states.items()):
        if len(slots) != len(recurrent):
            problems.append(f"request {request_id} has {len(slots)} state slots for {len(recurrent)} recurrent groups")
            continue
        for slot in slots:
            if not 0 <= slot < view.state_slots:
                problems.append(f"request {request_id} holds state slot {slot}, outside the {view.state_slots} slots")
            elif slot in owner:
                problems.append(f"state slot {slot} is request {owner[slot]}'s and request {request_id}'s")
            elif slot in view.state_free or slot in view.snapshots:
                what = "free" if slot in view.state_free else f"a snapshot under key {view.snapshots[slot]!r:.40}"
                problems.append(f"request {request_id}'s state slot {slot} is {what}: another owner may write it")
            owner[slot] = request_id
    outside = sorted(slot for slot in (*view.snapshots, *view.state_free) if not 0 <= slot < view.state_slots)
    if outside:
        problems.append(f"state slots {outside} are outside the {view.state_slots} slots")
    return problems


class GhostStates:
    """The ghost state of every slot a `SafetyMachine`'s manager has shown, checked as it goes."""

    def __init__(self, machine: SafetyMachine, groups: Sequence[Group]) -> None:
        self.machine = machine
        self.recurrent = recurrent_groups(groups)
        self.states: dict[int, Context] = {}  # slot -> the context its state consumed
        self.key_state: dict[object, Context | None] = {}  # snapshot key -> its state when first seen

    def copy(self, pairs: Copies, request_id: int, view: PoolView) -> None:
        """Make the state copies the manager asked for: never into another live request's slot."""
        for source, destination in pairs:
            others = [rid for rid, slots in view.states.items() if rid != request_id and destination in slots]
            if others:
                self.machine._fail(
                    FailureKind.EXCLUSIVE,
                    f"request {request_id}'s state copy from slot {source} writes slot {destination},"
                    f" which is request {others[0]}'s state",
                )
            if source in self.states:
                self.states[destination] = self.states[source]
            else:
                self.states.pop(destination, None)
            self.machine.coverage["state_copies"] += 1

    def advance(self, request_id: int, view: PoolView, position: int, context: Callable[[int, int], Context]) -> None:
        """The pass computes `position`: each recurrent group's query reads the request's state
        (the state after every earlier position, none at position 0) and leaves the state after
        `position`. `context(group, position)` is the request's context through `position`."""
        for index, group in enumerate(self.recurrent):
            slot = view.states[request_id][index]
            if position:
                wanted, found = context(group, position - 1), self.states.get(slot)
                if found != wanted:
                    self.machine._fail(
                        FailureKind.GHOST,
                        f"request {request_id} resumes group {group}'s state at position {position} from slot"
                        f" {slot}, which holds {'nothing' if found is None else f'the state after {found}'},"
                        f" not the state after {wanted}",
                    )
            self.states[slot] = context(group, position)

    def pick(self, request_id: int, view: PoolView, last: int, context: Callable[[int, int], Context]) -> None:
        """After `accept`: the request's state is the one after its accepted tokens (through
        position `last`), kept by the model at every draft."""
        for index, group in enumerate(self.recurrent):
            self.states[view.states[request_id][index]] = context(group, last)

    def keys(self, view: PoolView) -> None:
        """A snapshot's key names the state it was first seen cached over."""
        for slot, key in view.snapshots.items():
            held = self.states.get(slot)
            named = self.key_state.setdefault(key, held)
            if named != held:
                self.machine._fail(
                    FailureKind.GHOST,
                    f"state slot {slot} is a snapshot under key {key!r:.60}, first seen over the state after"
                    f" {named}, but holds {'nothing' if held is None else f'the state after {held}'}",
                )

    def leaks(self, view: PoolView) -> list[int]:
        """The slots neither free nor a snapshot's (once every request is freed: lost)."""
        if not self.recurrent:
            return []
        return sorted(set(range(view.state_slots)) - view.state_free - set(view.snapshots))
