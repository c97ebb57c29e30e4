"""The z3 invariant tied to the spec's: on a concrete state, both say the same thing.

`encode(state)` is ground, whatever the state: arrays are constants with stores, the ghost
inverses (`pos`, `tpos`, `epos`) and `held` are computed from the concrete lists, the owner
counters are the true counts and `pend` is zero. So every conjunct of an encoded state is a
closed formula, true or false, also for a corrupted state: a page twice on the free stack or in
a table leaves one occurrence its inverse does not point back to, a count off by one breaks
`refs == tcnt + scnt + ext`. `Evaluator` decides each formula with z3; the negation of a closed
universal formula is ground after skolemization (arrays and linear integers, decidable), and
each check is bounded by z3's resource units, never by time, so no verdict depends on the machine.

`disagreements` compares, on every state:
- the whole: the conjuncts that carry a spec invariant all hold exactly when `check_invariants`
  names none;
- each invariant: the conjuncts carrying it hold only if it holds (so proving them proves it),
  and hold whenever it holds, except on states that break an invariant its encoding leans on
  (`LEANS_ON`);
- every model-level conjunct (sizes, nothing in flight, the counting facts) holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import z3

from kvsched.proofs.encode import encode
from kvsched.proofs.inductive import bounded_solver
from kvsched.proofs.invariant import Conjunct, counting_facts
from kvsched.proofs.model import FIELDS, Bool, fresh
from kvsched.spec.invariants import (
    INVARIANTS,
    Invariant,
    check_invariants,
    inv_free_stack_exact,
    inv_refcounts_bounded,
    inv_tables_hold_their_pages,
)
from kvsched.spec.system import SystemState

RESOURCE_LIMIT = 2_000_000
"""z3's resource units per concrete check: all conjuncts of a small state take up to about 50,000."""

COUNTING = Conjunct("counting_facts", None, counting_facts, "assumed of every pre-state")
"""The counting facts as a model-level conjunct: true of every encoding, which counts truly."""

LEANS_ON: dict[Invariant, tuple[Invariant, ...]] = {
    inv_free_stack_exact: (inv_refcounts_bounded,),
    inv_tables_hold_their_pages: (inv_refcounts_bounded,),
}
"""Where a conjunct asks more than its invariant, of states that break another one.

A negative count (which `inv_refcounts_bounded` rules out) is not "free" to the spec, but
`encode` counts `held` as the positive counts, so `top + held == pages` fails; and a table's page
must have `refs >= 1` in the model where the spec asks `refs != 0`.
"""


@dataclass(frozen=True)
class Disagreement:
    """Where the model and the spec differ: which state, about what, and each one's verdict."""

    state: int
    about: str  # "the invariant", an `inv_*` name, or a model-level conjunct's name
    spec: bool
    model: bool


class Evaluator:
    """Decides conjuncts on encoded states, remembering each state's encoding and each verdict.

    Each conjunct is built once over symbolic fields and substituted with a state's encoding;
    the conjuncts not yet decided for a state are first checked together, one by one only if
    some fails.
    """

    def __init__(self, resource_limit: int = RESOURCE_LIMIT) -> None:
        self._symbolic = fresh("concrete")
        self._terms: dict[Conjunct, Bool] = {}
        self._known: dict[tuple[Conjunct, SystemState], bool] = {}
        self._encodings: dict[SystemState, list[tuple[z3.ExprRef, z3.ExprRef]]] = {}
        self._solver = bounded_solver(resource_limit)

    def _term(self, conjunct: Conjunct) -> Bool:
        if conjunct not in self._terms:
            self._terms[conjunct] = conjunct.holds(self._symbolic)
        return self._terms[conjunct]

    def _decide(self, term: Bool, values: list[tuple[z3.ExprRef, z3.ExprRef]]) -> bool:
        self._solver.push()
        self._solver.add(z3.Not(z3.substitute(term, *values)))
        answer = self._solver.check()
        self._solver.pop()
        if answer == z3.unknown:
            raise RuntimeError(f"z3 could not decide a concrete conjunct: {self._solver.reason_unknown()}")
        return bool(answer == z3.unsat)

    def values(self, state: SystemState, conjuncts: Sequence[Conjunct]) -> tuple[bool, ...]:
        """Whether each conjunct holds of `encode(state)`."""
        new = [conjunct for conjunct in dict.fromkeys(conjuncts) if (conjunct, state) not in self._known]
        if new:
            if state not in self._encodings:
                encoded = encode(state)
                self._encodings[state] = [(getattr(self._symbolic, name), getattr(encoded, name)) for name in FIELDS]
            values = self._encodings[state]
            every = self._decide(z3.And([self._term(conjunct) for conjunct in new]), values)
            for conjunct in new:
                self._known[conjunct, state] = every or self._decide(self._term(conjunct), values)
        return tuple(self._known[conjunct, state] for conjunct in conjuncts)


def carried(conjuncts: Iterable[Conjunct]) -> tuple[Invariant, ...]:
    """The spec invariants some conjunct carries, in `INVARIANTS` order."""
    some = {conjunct.carries for conjunct in conjuncts if conjunct.carries is not None}
    return tuple(invariant for invariant in INVARIANTS if invariant in some)


def _compare(
    index: int, state: SystemState, conjuncts: Sequence[Conjunct], values: Sequence[bool]
) -> list[Disagreement]:
    failing = check_invariants(state)
    found = []
    model_all = all(value for conjunct, value in zip(conjuncts, values, strict=True) if conjunct.carries is not None)
    if model_all != (not failing):
        found.append(Disagreement(index, "the invariant", not failing, model_all))
    for invariant in carried(conjuncts):
        spec = invariant.__name__ not in failing
        model = all(value for conjunct, value in zip(conjuncts, values, strict=True) if conjunct.carries is invariant)
        leaned_on_hold = all(other.__name__ not in failing for other in LEANS_ON.get(invariant, ()))
        if (model and not spec) or (spec and not model and leaned_on_hold):
            found.append(Disagreement(index, invariant.__name__, spec, model))
    for conjunct, value in zip(conjuncts, values, strict=True):
        if conjunct.carries is None and not value:
            found.append(Disagreement(index, conjunct.name, True, False))
    return found


def disagreements(
    states: Iterable[SystemState], conjuncts: Iterable[Conjunct], evaluator: Evaluator | None = None
) -> list[Disagreement]:
    """Every place where `conjuncts`, evaluated on the encoded states, differ from the spec."""
    evaluator = evaluator or Evaluator()
    checked = tuple(conjuncts)
    found: list[Disagreement] = []
    for index, state in enumerate(states):
        found += _compare(index, state, checked, evaluator.values(state, checked))
    return found
