"""Preservation checks for the small z3 models (the engine's state slots, the prefix cache): a
transition keeps the model's invariant from every state of every size (`unsat` of its
negation), or of a bounded size where a `sat` comes with a counterexample (how a broken form is
refuted); and it is enabled from some bounded state satisfying the invariant (so the proof is
not vacuous). Every check is bounded by z3's resource count, never a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import z3

from kvsched.proofs.inductive import decide
from kvsched.proofs.model import Bool, Int

S = TypeVar("S")
Transition = Callable[[Any, Any], Bool]


def every(body: Callable[[Int], Bool], name: str, values: range, bounded: bool) -> Bool:
    """`body` of every integer (a quantifier), or, `bounded`, of each of `values`."""
    if bounded:
        return z3.And(*(body(z3.IntVal(value)) for value in values))
    variable = z3.Int(f"inv.{name}")
    return z3.ForAll([variable], body(variable))


@dataclass(frozen=True)
class SmallModel(Generic[S]):
    """A state constructor, its invariant (quantified, or over the bound), the bound on the
    transitions' free variables, and the resource limit per check."""

    state: Callable[[str], S]
    invariant: Callable[[S, bool], Bool]
    within_bound: Callable[[], Bool]
    resource_limit: int

    def preserves(self, transition: Transition, bounded: bool = False) -> z3.CheckSatResult:
        """`unsat`: `transition` keeps the invariant at every size (or at the bounded one)."""
        x, y = self.state("x"), self.state("y")
        domain = self.within_bound() if bounded else z3.BoolVal(True)
        claim = z3.And(domain, self.invariant(x, bounded), transition(x, y), z3.Not(self.invariant(y, bounded)))
        return decide(claim, self.resource_limit)

    def enabled(self, transition: Transition) -> z3.CheckSatResult:
        """`sat`: a bounded state satisfying the invariant can take `transition`."""
        x, y = self.state("x"), self.state("y")
        return decide(z3.And(self.within_bound(), self.invariant(x, True), transition(x, y)), self.resource_limit)

    def report(
        self, label: str, width: int, proved: Mapping[str, Transition], broken: Mapping[str, Transition]
    ) -> bool:
        """Prove every transition of `proved` and refute every one of `broken`, a line each;
        True when all is as it must be."""
        ok = True
        for name, transition in proved.items():
            verdict, witnessed = self.preserves(transition), self.enabled(transition)
            ok &= verdict == z3.unsat and witnessed == z3.sat
            print(f"{label}  {name:<{width}} {'proved' if verdict == z3.unsat else verdict}, enabled: {witnessed}")
        for name, transition in broken.items():
            refuted = self.preserves(transition, bounded=True)
            ok &= refuted == z3.sat
            print(f"{label}  {name:<{width}} {'refuted' if refuted == z3.sat else 'NOT REFUTED: ' + str(refuted)}")
        return ok


def invariant_holds(claim: Bool, resource_limit: int, what: str) -> bool:
    """Whether `claim` (an invariant on a ground, encoded state) holds, decided by z3 within its
    resource units (never a clock); `RuntimeError` naming `what` when z3 cannot decide."""
    verdict = decide(z3.Not(claim), resource_limit)
    if verdict == z3.unknown:
        raise RuntimeError(f"z3 could not decide {what}")
    return bool(verdict == z3.unsat)
