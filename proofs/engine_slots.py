"""z3 proofs that the engine's recurrent-state slots are conserved, for every number of slots
and every request id: the engine's transitions on them keep the ownership invariant.

The state (unbounded arrays over the integers, `slots` any non-negative size):

    owner[s]   the request holding slot s, 0 when free          (for 0 <= s < slots)
    copies[s]  how many times s is in the free structure        (impl's min-heap of free slots)
    holds[r]   the slot request r holds, -1 when none            (for every request r > 0)

The invariant (`inv_engine_state_slots_exact`, as values): a slot is in the free structure
exactly once when free and not at all when held; a held slot's owner holds it; a request
holds at most one slot, a valid one, and is its owner. So free + held = slots, and no two
requests share a slot. The engine changes slots by two transitions only: `take(r, s)` when it
admits request r into the free slot s, and `give_back(r)` when r finishes, is cancelled or is
preempted. Each is proved to keep the invariant (`unsat` of its negation); the broken forms
(a slot given back twice, a held slot taken) are refuted with a counterexample, so the proofs
are not vacuous, and the hypotheses are shown satisfiable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvsched.proofs.model import Arr, Bool, Int
from kvsched.proofs.preservation import SmallModel, every

RESOURCE_LIMIT = 5_000_000  # z3's counted resource units per check (never a wall-clock timeout)


@dataclass(frozen=True)
class Slots:
    """One state of the slots."""

    slots: Int
    owner: Arr
    copies: Arr
    holds: Arr


def state(name: str) -> Slots:
    return Slots(
        z3.Int(f"{name}.slots"),
        z3.Array(f"{name}.owner", z3.IntSort(), z3.IntSort()),
        z3.Array(f"{name}.copies", z3.IntSort(), z3.IntSort()),
        z3.Array(f"{name}.holds", z3.IntSort(), z3.IntSort()),
    )


BOUND = 3  # bounded checks: 3 slots, requests 1..3 (where z3 builds witnesses and counterexamples)


def invariant(x: Slots, bounded: bool = False) -> Bool:
    """The invariant, quantified (every size), or over `BOUND` slots and requests (`bounded`)."""

    def slot_rule(s: Int) -> Bool:
        free_once = z3.If(x.owner[s] == 0, x.copies[s] == 1, x.copies[s] == 0)
        owned = z3.Implies(x.owner[s] != 0, z3.And(x.owner[s] > 0, x.holds[x.owner[s]] == s))
        return z3.Implies(z3.And(s >= 0, s < x.slots), z3.And(free_once, owned))

    def request_rule(r: Int) -> Bool:
        valid = z3.And(x.holds[r] >= 0, x.holds[r] < x.slots, x.owner[x.holds[r]] == r)
        return z3.Implies(z3.And(r > 0, x.holds[r] != -1), valid)

    size = x.slots == BOUND if bounded else x.slots >= 0
    return z3.And(
        size, every(slot_rule, "s", range(BOUND), bounded), every(request_rule, "r", range(1, BOUND + 1), bounded)
    )


def take(x: Slots, y: Slots, request: Int, slot: Int, *, check_free: bool = True) -> Bool:
    """Admission: request (holding none) takes a slot from the free structure."""
    guard = [request > 0, x.holds[request] == -1, slot >= 0, slot < x.slots]
    if check_free:
        guard.append(x.copies[slot] >= 1)
    return z3.And(
        *guard,
        y.slots == x.slots,
        y.owner == z3.Store(x.owner, slot, request),
        y.copies == z3.Store(x.copies, slot, x.copies[slot] - 1),
        y.holds == z3.Store(x.holds, request, slot),
    )


def give_back(x: Slots, y: Slots, request: Int, *, times: int = 1) -> Bool:
    """Finish, cancel or preempt: the request's slot goes back to the free structure."""
    slot = x.holds[request]
    return z3.And(
        request > 0,
        slot != -1,
        y.slots == x.slots,
        y.owner == z3.Store(x.owner, slot, 0),
        y.copies == z3.Store(x.copies, slot, x.copies[slot] + times),
        y.holds == z3.Store(x.holds, request, -1),
    )


Transition = Callable[[Slots, Slots], Bool]


def transitions() -> dict[str, Transition]:
    """The engine's transitions on its slots, by name (request and slot free variables)."""
    request, slot = z3.Ints("request slot")
    return {
        "take": lambda x, y: take(x, y, request, slot),
        "give_back": lambda x, y: give_back(x, y, request),
    }


def broken() -> dict[str, Transition]:
    """The broken forms that must be refuted."""
    request, slot = z3.Ints("request slot")
    return {
        "give_back_twice": lambda x, y: give_back(x, y, request, times=2),
        "take_a_held_slot": lambda x, y: take(x, y, request, slot, check_free=False),
    }


def _requests_within_bound() -> Bool:
    request, slot = z3.Ints("request slot")
    return z3.And(request >= 1, request <= BOUND, slot >= -1, slot <= BOUND)


def main() -> int:
    """Prove every transition, refute every broken one; 0 when all is as it must be."""
    ok = MODEL.report("engine slots", 18, transitions(), broken())
    return 0 if ok else 1


MODEL = SmallModel(state, invariant, _requests_within_bound, RESOURCE_LIMIT)
preserves = MODEL.preserves
enabled = MODEL.enabled


if __name__ == "__main__":
    raise SystemExit(main())
