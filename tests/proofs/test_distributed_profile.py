"""`kvsched proofs --workers N`'s explorations give the single process's search (a module of its
own: it imports the runner, and so z3, which `make ray`'s venv does not have)."""

from __future__ import annotations

import pytest

from kvsched.proofs.distributed import DistributedSearch, Recipe
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.runner import CI, Run, label
from kvsched.proofs.subject import IMPL
from tests.proofs.test_distributed import summary

# impl's explorations of `kvsched proofs`' CI profile (impl in lockstep with the spec, each state
# reached along its path). The spec's two (depth 6 at the sizes: 27,385 states; the
# R2 P3 L2 E1x2 closure: 83,950 states, 200 s in one process) agree too, measured in
# docs/bench/runs.md; too long for `make proofs`.
IMPL_RUNS = [run for run in CI if run.subject is IMPL]


@pytest.mark.proof
@pytest.mark.parametrize("run", IMPL_RUNS, ids=lambda run: label(run.subject.name, run.bounds, None))
def test_impls_explorations_of_the_ci_profile_on_workers_are_the_single_process(run: Run) -> None:
    """`kvsched proofs --workers 2`'s impl explorations (one owner of the seen-set per worker) give
    the single process's states, numbering, counts and verdict."""
    explorer = Explorer(run.bounds, run.subject, run.reference)
    alone = explorer.run()
    reference = None if run.reference is None else run.reference.name
    search = DistributedSearch(Recipe(run.bounds, run.subject.name, reference), workers=2, partitions=2)
    assert summary(search.run()) == summary(alone)
    assert search.explorer.via == explorer.via and search.explorer.parent == explorer.parent
