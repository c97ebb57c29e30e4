"""The seen-set in parts, each kept by an owner process: the answers of one set, an owner that dies
replaced from its log, and a search over owners numbering as the single process numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvsched.proofs.distributed import DistributedSearch, Recipe
from kvsched.proofs.engine_explorer import SMALL, EngineExplorer, EngineRecipe, engine_named
from kvsched.proofs.explorer import Explorer
from kvsched.proofs.operations import ISSUE
from kvsched.proofs.seen import Owner, Partitions
from kvsched.proofs.subject import variant
from tests.proofs.test_distributed import FOUR, summary
from tests.proofs.test_distributed_paths import engine_summary

KEYS = [("a", 1), ("b", 2), 3, frozenset({4, 5}), ("c", (6, 7))]


def test_the_owners_answer_as_one_set_and_forget_from_a_number() -> None:
    with Partitions(2) as owners:
        assert owners.seen(KEYS) == [False] * 5
        owners.insert(KEYS[:3], [0, 1, 2])
        assert owners.seen(KEYS) == [True, True, True, False, False]
        owners.insert(KEYS[3:], [3, 4])
        assert sum(owners.sizes()) == 5 and all(size > 0 for size in owners.sizes())  # both parts hold keys
        owners.forget(2)
        assert owners.seen(KEYS) == [True, True, False, False, False]  # the last key forgotten too


def test_an_owner_that_dies_is_replaced_from_its_log() -> None:
    with Partitions(2) as owners:
        owners.insert(KEYS, list(range(5)))
        owners.forget(4)
        for process in owners.processes:
            process.kill()
            process.join()
        assert owners.seen(KEYS) == [True, True, True, True, False]
        assert owners.restarts == 2


def test_the_system_explorer_over_owners_is_the_single_process() -> None:
    explorer = Explorer(FOUR)
    alone = explorer.run()
    search = DistributedSearch(Recipe(FOUR), workers=2, partitions=2)
    assert summary(search.run()) == summary(alone)
    assert search.explorer.via == explorer.via and search.explorer.parent == explorer.parent
    assert search.explorer.index == {}  # the coordinator kept no key


def test_a_new_states_invariant_walked_back_to_over_owners() -> None:
    """The owners forget what the level walked again had numbered: the same counterexample."""
    bounds = replace(ISSUE, max_depth=5)
    name = "finish leaks one page"
    alone = Explorer(bounds, variant(name)).run()
    search = DistributedSearch(Recipe(bounds, f"spec variant: {name}"), workers=1, partitions=2)
    assert summary(search.run()) == summary(alone)


def test_the_engine_explorer_over_owners_is_the_single_process() -> None:
    bounds = replace(SMALL, max_states=400)
    single = EngineExplorer(bounds, engine_named("spec"))
    alone = single.run()
    search = DistributedSearch(EngineRecipe(bounds), workers=2, partitions=3)
    searched = search.run(bounds.max_states)
    assert engine_summary(search.explorer.outcome(searched)) == engine_summary(alone)
    assert search.explorer.via == single.via and search.explorer.parent == single.parent


class ForgetsTheLastKey(DistributedSearch[Explorer]):
    """A coordinator that does not hand its owners the last key each walk numbered."""

    def _settle(self) -> None:
        if self._numbered:
            self._numbered.popitem()
        super()._settle()


def test_a_coordinator_that_keeps_back_the_last_key_gives_other_counts() -> None:
    alone = Explorer(FOUR).run()
    assert summary(ForgetsTheLastKey(Recipe(FOUR), workers=1, partitions=2).run()) != summary(alone)


@pytest.mark.ray
def test_owners_as_ray_actors_give_the_single_process_search() -> None:
    pytest.importorskip("ray", reason="make ray installs kvsched[ray] and runs this")
    alone = Explorer(FOUR).run()
    assert summary(DistributedSearch(Recipe(FOUR), ray="local", partitions=2).run()) == summary(alone)


def test_a_record_cut_short_by_a_death_is_dropped_and_the_log_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "part-0.log"
    owner = Owner(str(log))
    owner.insert(KEYS[:2], [0, 1])
    owner.insert(KEYS[2:4], [2, 3])
    whole = log.read_bytes()
    log.write_bytes(whole[:-3])  # the second record cut short
    again = Owner(str(log))
    assert again.seen(KEYS) == [True, True, False, False, False]
    again.insert(KEYS[2:], [2, 3, 4])  # sent again, after the cut record's bytes were dropped
    assert Owner(str(log)).seen(KEYS) == [True] * 5
