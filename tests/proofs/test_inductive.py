"""The z3 proofs: every transition proved for every size, none vacuous, each able to fail."""

from __future__ import annotations

import pytest
import z3

from kvsched.proofs.broken import CORPUS, Broken
from kvsched.proofs.inductive import prove, refute, split_goal, times_by_transition, witnesses
from kvsched.proofs.model import bound
from kvsched.proofs.obligations import COVERS, obligations

TRANSITIONS = sorted({obligation.transition for obligation in obligations()})


def test_every_goal_is_proved_for_every_size() -> None:
    # Each part of a goal proves within 500,000 of z3's resource units (the largest takes about
    # 14,000; an explicit sum over 16 pages, 13-30 s of solving, would not): a count, not a clock,
    # so a loaded machine gives the same verdict. A part past it comes back "unknown".
    results = prove(resource_limit=500_000)
    failed = [(r.transition, r.step, r.goal, r.outcome, r.detail[:300]) for r in results if r.outcome != "proved"]
    assert not failed
    assert set(times_by_transition(results)) == set(TRANSITIONS)


def test_the_proofs_cover_the_issue_transitions() -> None:
    expected = {
        "pool.allocate",
        "pool.retain",
        "pool.release",
        "pool.writable",
        "ensure_writable",
        "retain_pending (sets)",
        "retain_pending (rows)",
        "release_pending (sets)",
        "release_pending (rows)",
        "fork",
        "finish",
        "admit_miss",
        "admit_hit",
        "publish",
        "remove",
        "reclaim",
        "decode_round",
        "initial",
    }
    assert expected <= set(TRANSITIONS)


def test_no_obligation_is_vacuous() -> None:
    # satisfiable hypotheses: some small (hence some unbounded) state meets each obligation's
    answers = witnesses()
    assert len(answers) == len(obligations())
    assert {key: answer for key, answer in answers.items() if answer != "sat"} == {}


@pytest.mark.parametrize("broken", CORPUS, ids=lambda b: f"{b.name}-{b.transition}")
def test_broken_encoding_is_refuted_with_a_counterexample(broken: Broken) -> None:
    result = refute(broken.encoding(), broken.transition, broken.violates)
    assert result is not None, f"{broken.name} was not refuted"
    assert result.outcome == "refuted"
    assert "refs=" in result.detail and "arguments:" in result.detail


def test_every_transition_says_what_it_covers() -> None:
    assert set(COVERS) == set(TRANSITIONS)


def test_the_corpus_breaks_every_transition() -> None:
    assert {broken.transition for broken in CORPUS} == set(TRANSITIONS)


def test_bound_variables_cannot_capture_free_constants() -> None:
    # z3 binds by name: ForAll([Int("i")], ...) would capture a free list index called "i"
    (i,) = bound("i")
    free = z3.Int("i")
    assert not i.eq(free)
    solver = z3.Solver()
    solver.add(z3.Not(z3.ForAll([i], z3.Implies(i == free, i == free))))
    assert solver.check() == z3.unsat


def test_split_goal_keeps_the_meaning() -> None:
    x, y = z3.Ints("x y")
    (v,) = bound("v")
    goal = z3.And(x > 0, z3.ForAll([v], z3.If(v > x, z3.And(v > 0, v != y), v <= x)))
    parts = split_goal(goal)
    assert len(parts) == 4
    solver = z3.Solver()
    solver.add(z3.Not(goal == z3.And(parts)))
    assert solver.check() == z3.unsat
