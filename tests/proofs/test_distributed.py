"""The system explorer's search on many workers gives the single process's search: the same
states, transitions, checks, depth and counterexample, on 1 and 2 worker processes."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.proofs.distributed import VARIANT, Batch, DistributedSearch, NotDistributable, Recipe
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.operations import ISSUE, Bounds
from kvsched.proofs.search import Searched
from kvsched.proofs.subject import IMPL, SPEC, Subject, variant
from kvsched.testing.checks import FailureKind
from kvsched.testing.system import SystemConfig, SystemUnderTest, spec_system

TINY = Bounds(requests=1, pages=2, logical_pages=1, entries=1, entry_pages=1)
FOUR = replace(ISSUE, max_depth=4)  # the issue's sizes to depth 4: 469 classes of states


def summary(result: Searched) -> tuple[Any, ...]:
    """What must not depend on the number of workers (a failure's words aside: see the module)."""
    found = result.violation
    violation = None if found is None else (found.kind, found.path, found.event)
    return result.states, result.transitions, result.checks, result.depth, result.complete, violation


def test_the_counts_are_the_single_process_counts() -> None:
    bounds = FOUR
    explorer = Explorer(bounds)
    alone = explorer.run()
    assert alone.complete and alone.violation is None and alone.states > 1
    for workers in (1, 2):
        search = DistributedSearch(Recipe(bounds), workers=workers)
        assert summary(search.run()) == summary(alone)
        assert sum(level.found for level in search.levels) == alone.states - 1  # every state found once
        assert search.explorer.states == explorer.states  # numbered in the same order
        assert search.explorer.via == explorer.via and search.explorer.parent == explorer.parent


class LastBatchLost(DistributedSearch[Explorer]):
    """A coordinator that loses the last batch of every level of more than one batch."""

    def _run(self, level: list[int], *, events: bool) -> list[Batch]:
        batches = super()._run(level, events=events)
        return batches[:-1] if len(batches) > 1 else batches


def test_a_coordinator_that_loses_a_batch_gives_other_counts() -> None:
    alone = Explorer(FOUR).run()
    assert summary(LastBatchLost(Recipe(FOUR), workers=1).run()) != summary(alone)


@pytest.mark.parametrize(
    ("name", "kind", "workers"),
    [
        ("finish leaks one page", FailureKind.INVARIANT, (1, 2)),
        ("pages reused first-in-first-out", FailureKind.LIFO, (2,)),
    ],
)
def test_a_broken_system_gives_the_same_counterexample(name: str, kind: FailureKind, workers: tuple[int, ...]) -> None:
    """A state's invariants (checked when its own level runs, then walked back to) and a step's
    check (found in the walk) each stop the search where the single process stops."""
    bounds = replace(ISSUE, max_depth=5)
    alone = Explorer(bounds, variant(name)).run()
    assert alone.violation is not None and alone.violation.kind is kind
    for count in workers:
        assert summary(DistributedSearch(Recipe(bounds, VARIANT + name), workers=count).run()) == summary(alone)


def test_max_states_stops_where_the_single_process_stops() -> None:
    alone = Explorer(FOUR).run(max_states=100)
    spread = DistributedSearch(Recipe(FOUR), workers=1).run(max_states=100)
    assert not alone.complete and alone.states >= 100
    assert summary(spread) == summary(alone)


def test_impl_in_lockstep_reached_along_its_paths_is_the_single_process() -> None:
    """impl's systems cannot be loaded with a kept state: a worker replays each state's path."""
    explorer = Explorer(TINY, IMPL, SPEC)
    alone = explorer.run()
    assert alone.complete and alone.violation is None and alone.states > 10
    search = DistributedSearch(Recipe(TINY, IMPL.name, SPEC.name), workers=2, partitions=2)
    assert summary(search.run()) == summary(alone)
    assert search.explorer.via == explorer.via and search.explorer.parent == explorer.parent


def test_a_name_that_is_not_a_subject_is_refused() -> None:
    with pytest.raises(NotDistributable, match="not a Subject"):
        DistributedSearch(Recipe(TINY, "kvsched.proofs.operations:ISSUE"), workers=1).run()


def test_the_proofs_command_refuses_a_negative_worker_count() -> None:
    from kvsched.proofs.runner import main

    with pytest.raises(SystemExit) as stopped:
        main(["--only", "explore", "--workers", "-1"])
    assert stopped.value.code == 2


def test_the_scaling_command_refuses_no_workers() -> None:
    from kvsched.proofs.distributed import main

    with pytest.raises(SystemExit) as stopped:
        main(["--workers", "0"])
    assert stopped.value.code == 2


@pytest.mark.ray
def test_a_local_ray_cluster_gives_the_single_process_search() -> None:
    pytest.importorskip("ray", reason="make ray installs kvsched[ray] and runs this")
    alone = Explorer(FOUR).run()
    assert summary(DistributedSearch(Recipe(FOUR), ray="local").run()) == summary(alone)


DIE_FIRST = "KVSCHED_TEST_SEARCH_DIES"  # a marker file: the first worker that finds it absent dies


def dying_system(config: SystemConfig) -> SystemUnderTest:
    """The spec's system, whose first construction in a worker process kills the process (once:
    it leaves the marker file behind)."""
    marker = Path(os.environ[DIE_FIRST])
    if multiprocessing.parent_process() is not None and not marker.exists():
        marker.write_text("died once")
        os._exit(3)
    return spec_system(config)


DYING = Subject("spec, its first worker dying", dying_system, "", "")


def test_a_worker_that_dies_has_its_batch_run_again_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "died"
    monkeypatch.setenv(DIE_FIRST, str(marker))
    alone = Explorer(FOUR).run()
    spread = DistributedSearch(Recipe(FOUR, f"{__name__}:DYING"), workers=2).run()
    assert marker.exists(), "no worker died: the test did not test anything"
    assert summary(spread) == summary(alone)
