"""The engine explorer and the component explorer on many workers: each state shipped as its path
of events and replayed there, and the search is the single process's (its states in the same
numbering, transitions, checks, the explorer's own tallies, the counterexample and its path)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from kvsched.proofs.component_explorer import ComponentExplorer, ComponentRecipe
from kvsched.proofs.distributed import DistributedSearch, SearchRecipe
from kvsched.proofs.engine_explorer import (
    CACHED,
    HOSTED,
    SMALL,
    EngineBounds,
    EngineExploration,
    EngineExplorer,
    EngineRecipe,
    engine_named,
)
from kvsched.proofs.search import Searched
from kvsched.testing.checks import FailureKind
from kvsched.testing.registry import COMPONENTS

SMALL_FIRST = replace(SMALL, max_states=400)
HOSTED_FIRST = replace(HOSTED, max_states=250)  # copies in flight, failed and completed among them


def engine_summary(result: EngineExploration) -> tuple[Any, ...]:
    violation = None if result.violation is None else result.violation.kind
    tallies = (result.preemptions, result.cache_hits, result.host_hits, result.refusals)
    return result.states, result.transitions, result.complete, tallies, violation, result.path


def search_summary(result: Searched) -> tuple[Any, ...]:
    found = result.violation
    violation = None if found is None else (found.kind, found.path, found.event)
    return result.states, result.transitions, result.checks, result.depth, result.complete, violation


def spread(recipe: SearchRecipe[EngineExplorer], workers: int) -> tuple[EngineExploration, EngineExplorer]:
    search = DistributedSearch(recipe, workers=workers)
    searched = search.run(recipe.build().bounds.max_states)
    return search.explorer.outcome(searched), search.explorer


@pytest.mark.parametrize(("bounds", "workers"), [(SMALL_FIRST, (1, 2)), (HOSTED_FIRST, (2,))], ids=["small", "hosted"])
def test_the_engine_explorer_on_workers_is_the_single_process(bounds: Any, workers: tuple[int, ...]) -> None:
    single = EngineExplorer(bounds, engine_named("spec"))
    alone = single.run()
    assert alone.states >= bounds.max_states and alone.preemptions > 0 and alone.refusals > 0
    for count in workers:
        result, explorer = spread(EngineRecipe(bounds), count)
        assert engine_summary(result) == engine_summary(alone)
        assert explorer.via == single.via and explorer.parent == single.parent  # numbered in the same order


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # a step's own check, found in the walk (8 s: `make proofs`)
        pytest.param("preempt_to_back", FailureKind.ORDER, marks=pytest.mark.proof),
        ("state_slot_released_twice", FailureKind.INVARIANT),  # a new state's, walked back to
    ],
)
def test_a_broken_engine_gives_the_same_counterexample_on_workers(name: str, kind: FailureKind) -> None:
    alone = EngineExplorer(SMALL, engine_named(name)).run()
    assert alone.violation is not None and alone.violation.kind is kind
    result, _ = spread(EngineRecipe(SMALL, name), 2)
    assert engine_summary(result)[:2] + engine_summary(result)[4:] == engine_summary(alone)[:2] + (kind, alone.path)


class ShortReplayExplorer(EngineExplorer):
    """A worker's explorer that replays each state's path but its last event: it expands the parent."""

    def arrive(self, shipped: Any, memo: dict[Any, tuple[Any, Any]]) -> tuple[Any, Any, Any]:
        return super().arrive(shipped[:-1], memo)


@dataclass(frozen=True, slots=True)
class ShortReplay:
    """The recipe of `ShortReplayExplorer` over the spec's engine."""

    bounds: EngineBounds

    def build(self) -> ShortReplayExplorer:
        return ShortReplayExplorer(self.bounds, engine_named("spec"))


def test_a_replay_that_skips_the_last_event_gives_other_states() -> None:
    alone = EngineExplorer(SMALL_FIRST, engine_named("spec")).run()
    search = DistributedSearch(ShortReplay(SMALL_FIRST), workers=1)
    searched = search.run(SMALL_FIRST.max_states)
    assert (searched.states, searched.transitions) != (alone.states, alone.transitions)


def test_the_component_explorer_on_workers_is_the_single_process() -> None:
    """The KV groups' recurrent CI configuration, impl in lockstep with the spec (448 states)."""
    groups = next(component for component in COMPONENTS if component.name == "groups")
    recipe = ComponentRecipe(groups.name, groups.explored["ci"][1])
    single = recipe.build()
    alone = single.run()
    assert alone.complete and alone.violation is None and alone.states > 10
    search = DistributedSearch(recipe, workers=2)
    assert search_summary(search.run(100_000)) == search_summary(alone)
    explorer: ComponentExplorer = search.explorer
    assert explorer.via == single.via and explorer.parent == single.parent


@pytest.mark.proof
def test_a_broken_event_publisher_gives_the_same_counterexample_on_workers() -> None:
    """A replayed step takes its KV events as `observe` did in the single process, so a worker's
    engine publishes what the single process's did (8 s: `make proofs`)."""
    name = "stored_after_removed"
    alone = EngineExplorer(CACHED, engine_named(name)).run()
    assert alone.violation is not None and alone.violation.kind is FailureKind.EVENTS
    result, _ = spread(EngineRecipe(CACHED, name), 1)
    assert engine_summary(result) == engine_summary(alone)
