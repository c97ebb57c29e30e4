"""Inductive proofs: every transition keeps the invariant, for states of every size.

`prove` asks z3, for each goal of each obligation (obligations.py), for an unbounded state
where the hypotheses hold and the goal fails; `unsat` is a proof for every size. `refute` asks
the same question of small bounded states, where z3 can build the counterexample it finds, and
is how a broken encoding is shown to fail; `witness` shows an obligation's hypotheses are
satisfiable, so no proof holds vacuously.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from kvsched.proofs.model import Bool
from kvsched.proofs.obligations import Obligation, obligations
from kvsched.proofs.transitions import Encoding
from kvsched.proofs.universe import UNBOUNDED, Bounded, describe

SMALL = Bounded()
# z3's resource units per `check`: counted, unlike its wall-clock `timeout`, so a verdict never
# depends on how loaded the machine is. The largest goal of the default proofs takes about 14,000,
# the hardest refutation of a broken encoding about 3 million (it varies with what the process's z3
# context saw before, so the limit leaves a wide margin).
RESOURCE_LIMIT = 50_000_000
"""Small enough for z3 to build counterexamples in about a second."""


@dataclass(frozen=True)
class GoalResult:
    """One goal's outcome: `proved` (unsat), `refuted` (a counterexample) or `unknown`."""

    transition: str
    step: str
    goal: str
    outcome: str
    seconds: float
    parts: int
    detail: str = ""


def _conjuncts_of(body: Bool) -> list[Bool]:
    if z3.is_and(body):
        return [part for child in body.children() for part in _conjuncts_of(child)]
    if z3.is_app_of(body, z3.Z3_OP_IMPLIES):
        condition, consequence = body.children()
        return [z3.Implies(condition, part) for part in _conjuncts_of(consequence)]
    if z3.is_app_of(body, z3.Z3_OP_ITE) and z3.is_bool(body):
        condition, then, otherwise = body.children()
        return [
            *(z3.Implies(condition, part) for part in _conjuncts_of(then)),
            *(z3.Implies(z3.Not(condition), part) for part in _conjuncts_of(otherwise)),
        ]
    return [body]


def split_goal(goal: Bool) -> list[Bool]:
    """The goal as independent parts: `forall x. a and b` becomes `forall x. a`, `forall x. b`.

    A counterexample to one conjunct of a quantified goal is far easier for z3 to look for than
    one to their conjunction, where its search wanders through every branch at once.
    """
    if z3.is_and(goal):
        return [part for child in goal.children() for part in split_goal(child)]
    if z3.is_quantifier(goal) and goal.is_forall():
        names = [f"split.{goal.var_name(index)}" for index in range(goal.num_vars())]
        variables = [z3.Const(name, goal.var_sort(index)) for index, name in enumerate(names)]
        body = z3.substitute_vars(goal.body(), *reversed(variables))
        return [z3.ForAll(variables, part) for part in _conjuncts_of(body)]
    return [goal]


def bounded_solver(resource_limit: int = RESOURCE_LIMIT) -> z3.Solver:
    """A solver whose every `check` stops after `resource_limit` of z3's resource units."""
    solver = z3.Solver()
    solver.set("rlimit", resource_limit)
    return solver


def decide(claim: Bool, resource_limit: int = RESOURCE_LIMIT) -> z3.CheckSatResult:
    """`check` of the one `claim` on a bounded solver."""
    solver = bounded_solver(resource_limit)
    solver.add(claim)
    return solver.check()


def _solver(obligation: Obligation, resource_limit: int) -> z3.Solver:
    solver = bounded_solver(resource_limit)
    solver.add(*obligation.hypotheses)
    return solver


def _ask(solver: z3.Solver, part: Bool, obligation: Obligation, bounded: Bounded | None) -> tuple[str, str]:
    solver.push()
    solver.add(z3.Not(part))
    answer = solver.check()
    detail = ""
    if answer == z3.sat:
        state = describe(solver.model(), obligation.pre, bounded) if bounded else ""
        detail = f"fails: {part}\n{state}"
    elif answer != z3.unsat:
        detail = f"{solver.reason_unknown()}: {part}"
    solver.pop()
    outcome = "refuted" if answer == z3.sat else "proved" if answer == z3.unsat else "unknown"
    return outcome, detail


def check_obligation(
    obligation: Obligation, resource_limit: int = RESOURCE_LIMIT, bounded: Bounded | None = None
) -> list[GoalResult]:
    """Each goal's outcome, asking z3 part by part for a pre-state where it fails.

    One incremental solver per obligation (hypotheses asserted once, each part pushed and
    popped) is an order of magnitude faster than a fresh solver per part; a part it cannot
    decide is retried on a fresh solver.
    """
    solver = _solver(obligation, resource_limit)
    results = []
    for name, goal in obligation.goals:
        start = time.perf_counter()
        outcome, detail, parts = "proved", "", split_goal(goal)
        for part in parts:
            answer, why = _ask(solver, part, obligation, bounded)
            if answer == "unknown":
                answer, why = _ask(_solver(obligation, resource_limit), part, obligation, bounded)
            if answer == "refuted":
                outcome, detail = answer, why
                break
            if answer == "unknown" and outcome == "proved":
                # keep looking: another part may still have a counterexample
                outcome, detail = answer, why
        seconds = time.perf_counter() - start
        results.append(GoalResult(obligation.transition, obligation.step, name, outcome, seconds, len(parts), detail))
    return results


def prove(
    enc: Encoding | None = None,
    *,
    only: Callable[[Obligation], bool] | None = None,
    progress: bool = False,
    resource_limit: int = RESOURCE_LIMIT,
) -> list[GoalResult]:
    """Every goal of every obligation, for states of every size; progress lines go to stderr."""
    results: list[GoalResult] = []
    for obligation in obligations(enc, UNBOUNDED):
        if only is not None and not only(obligation):
            continue
        for result in check_obligation(obligation, resource_limit):
            results.append(result)
            if progress:
                print(
                    f"  {result.transition:26} {result.step:18} {result.goal:28} "
                    f"{result.outcome:8} {result.seconds * 1000:8.1f} ms",
                    file=sys.stderr,
                )
    return results


def refute(
    enc: Encoding, transition: str, goal: str, bounded: Bounded = SMALL, resource_limit: int = RESOURCE_LIMIT
) -> GoalResult | None:
    """A small state where `goal` of `transition` fails, with its counterexample, if any."""
    for obligation in obligations(enc, bounded):
        if obligation.transition != transition:
            continue
        targeted = replace(obligation, goals=tuple(g for g in obligation.goals if g[0] == goal))
        for result in check_obligation(targeted, resource_limit, bounded):
            if result.outcome == "refuted":
                return result
    return None


WITNESS_BOUNDS = (SMALL, Bounded(pages=2, requests=1, width=1), Bounded(pages=1, requests=1, width=1, capacity=1))


def witnesses(enc: Encoding | None = None, resource_limit: int = RESOURCE_LIMIT) -> dict[tuple[str, str], str]:
    """Per obligation, 'sat' when some small state satisfies its hypotheses (it is not vacuous).

    z3 may give up on one size (model-based quantifier instantiation is incomplete), so a few
    sizes are tried; a satisfying small state is also a state of the unbounded model.
    """
    answers: dict[tuple[str, str], str] = {}
    for bounded in WITNESS_BOUNDS:
        for obligation in obligations(enc, bounded):
            key = (obligation.transition, obligation.step)
            if answers.get(key, "unknown") == "unknown":
                answers[key] = str(_solver(obligation, resource_limit).check())
    return answers


def times_by_transition(results: list[GoalResult]) -> dict[str, tuple[int, float, bool]]:
    """Per transition: goals, seconds, and whether every goal was proved."""
    table: dict[str, tuple[int, float, bool]] = {}
    for result in results:
        goals, seconds, proved = table.get(result.transition, (0, 0.0, True))
        table[result.transition] = (goals + 1, seconds + result.seconds, proved and result.outcome == "proved")
    return table
