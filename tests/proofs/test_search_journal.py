"""A search on workers stopped between levels goes on from its journal, with the single process's
states, numbering, counts and counterexample, whether the coordinator keeps the seen-set or its
owners do."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.proofs.distributed import Cursor, DistributedSearch, Level, Recipe
from kvsched.proofs.engine_explorer import SMALL, EngineExplorer, EngineRecipe, engine_named
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.operations import ISSUE
from kvsched.proofs.subject import variant
from tests.proofs.test_distributed import FOUR, summary
from tests.proofs.test_distributed_paths import engine_summary


class Stopped(Exception):
    """The test stops the search."""


def stop_at(depth: int) -> Any:
    def report(level: Level) -> None:
        if level.depth == depth:
            raise Stopped

    return report


@pytest.mark.parametrize("partitions", [0, 2], ids=["coordinator", "owners"])
def test_a_search_stopped_after_a_level_goes_on_from_its_journal(tmp_path: Path, partitions: int) -> None:
    journal = str(tmp_path / "search.journal")
    single = Explorer(FOUR)
    alone = single.run()
    with pytest.raises(Stopped):
        DistributedSearch(Recipe(FOUR), workers=1, partitions=partitions, journal=journal, report=stop_at(3)).run()
    depths: list[int] = []
    search = DistributedSearch(
        Recipe(FOUR), workers=1, partitions=partitions, journal=journal, report=lambda level: depths.append(level.depth)
    )
    assert summary(search.run()) == summary(alone)
    assert depths == [3, 4]  # it went on from the level it stopped in (the walk of 3 was not saved)
    assert search.explorer.via == single.via and search.explorer.parent == single.parent
    assert [level.depth for level in search.levels] == [0, 1, 2, 3, 4]


class StopsOnceSaved(DistributedSearch[Any]):
    """A coordinator stopped right after it saved the level at `depth` (before that level runs)."""

    stop_depth = -1

    def _save_journal(self, cursor: Cursor) -> None:
        super()._save_journal(cursor)
        if cursor.depth == self.stop_depth:
            raise Stopped


@pytest.mark.parametrize("partitions", [0, 2], ids=["coordinator", "owners"])
def test_a_resumed_search_finds_the_counterexample_of_the_level_it_stopped_at(tmp_path: Path, partitions: int) -> None:
    """The broken system's bad state is found by the walk of level 2 (a later step's check stops
    that walk, and the found states' invariants send it back): stopped once level 2 was saved,
    the resumed search gives the same counterexample."""
    name = "finish leaks one page"
    bounds = replace(ISSUE, max_depth=5)
    alone = Explorer(bounds, variant(name)).run()
    assert alone.violation is not None
    recipe = Recipe(bounds, f"spec variant: {name}")
    journal = str(tmp_path / "search.journal")
    stopped = StopsOnceSaved(recipe, workers=1, partitions=partitions, journal=journal)
    stopped.stop_depth = len(alone.violation.path)  # the level of the bad state's parent
    with pytest.raises(Stopped):
        stopped.run()
    assert summary(DistributedSearch(recipe, workers=1, partitions=partitions, journal=journal).run()) == summary(alone)


@pytest.mark.proof  # (7-9 s each: `make proofs`)
@pytest.mark.parametrize("partitions", [0, 2], ids=["coordinator", "owners"])
def test_a_resumed_engine_search_runs_the_level_again_to_walk_back_to_a_bad_state(
    tmp_path: Path, partitions: int
) -> None:
    """The level holding the state whose invariants fail was saved, not yet run: the resumed
    search runs it, and then the level that found the state again (its answers were not saved)
    to walk back to it; the same counterexample."""
    name = "state_slot_released_twice"
    alone = EngineExplorer(SMALL, engine_named(name)).run()
    assert alone.violation is not None
    journal = str(tmp_path / "search.journal")
    stopped = StopsOnceSaved(EngineRecipe(SMALL, name), workers=1, partitions=partitions, journal=journal)
    stopped.stop_depth = len(alone.path)  # the bad state's level: the path ends with the event to it
    with pytest.raises(Stopped):
        stopped.run()
    search = DistributedSearch(EngineRecipe(SMALL, name), workers=1, partitions=partitions, journal=journal)
    searched = search.run(SMALL.max_states)
    found = engine_summary(search.explorer.outcome(searched))
    assert found[:2] + found[4:] == engine_summary(alone)[:2] + engine_summary(alone)[4:]


def test_the_journal_of_another_search_is_refused(tmp_path: Path) -> None:
    journal = str(tmp_path / "search.journal")
    DistributedSearch(Recipe(replace(FOUR, max_depth=2)), workers=1, journal=journal).run()
    with pytest.raises(ValueError, match="journal of another search"):
        DistributedSearch(Recipe(FOUR), workers=1, journal=journal).run()


def test_owners_logs_left_without_their_journal_are_not_read(tmp_path: Path) -> None:
    """A search whose journal is gone starts afresh: the owners' logs left beside it would
    answer that every state was seen."""
    journal = tmp_path / "search.journal"
    alone = Explorer(FOUR).run()
    DistributedSearch(Recipe(FOUR), workers=1, partitions=2, journal=str(journal)).run()
    journal.unlink()
    assert any((tmp_path / "search.journal.seen").glob("part-*.log"))
    search = DistributedSearch(Recipe(FOUR), workers=1, partitions=2, journal=str(journal))
    assert summary(search.run()) == summary(alone)
