"""A new component gets every harness by registration alone: a counter with two events and one
invariant, registered here and nowhere else, is driven by the machine base, searched by the
explorer, checked by the one step checker and listed by the catalogue; a counter broken past
its limit is caught by each."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st

from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec.errors import Exhausted
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import CheckFailed, FailureKind, capture, check_step
from kvsched.testing.component import Component, Corpus, EventSpec
from kvsched.testing.component_machine import machine_for
from tests.bugs.listing import listing_problems

LIMIT = 3


@dataclass(frozen=True, slots=True)
class CounterState:
    value: int
    limit: int


@dataclass(frozen=True, slots=True)
class Increment:
    def perform(self, counter: Any) -> Any:
        return counter.increment()


@dataclass(frozen=True, slots=True)
class Reset:
    def perform(self, counter: Any) -> Any:
        return counter.reset()


def inv_within_limit(state: CounterState) -> bool:
    return 0 <= state.value <= state.limit


class Counter:
    """The spec: counts up to its limit, refuses past it."""

    def __init__(self, limit: int) -> None:
        self.value, self.limit = 0, limit

    def increment(self) -> int:
        if self.value == self.limit:
            raise Exhausted(f"the counter is at its limit {self.limit}", needed=1, free=0)
        self.value += 1
        return self.value

    def reset(self) -> None:
        self.value = 0

    def to_spec(self) -> CounterState:
        return CounterState(self.value, self.limit)


class PastTheLimit(Counter):
    """Broken: counts past its limit."""

    def increment(self) -> int:
        self.value += 1
        return self.value


BROKEN = {"PastTheLimit": PastTheLimit}


def explore_increment(state: CounterState, config: int) -> Iterator[Increment]:
    yield Increment()


def explore_reset(state: CounterState, config: int) -> Iterator[Reset]:
    yield Reset()


COUNTER = Component(
    name="counter",
    summary="a counter with a limit",
    state=CounterState,
    events=(
        EventSpec(Increment, draw=lambda machine: st.just(Increment()), explore=explore_increment),
        EventSpec(Reset, draw=lambda machine: st.just(Reset()), explore=explore_reset),
    ),
    invariants=(inv_within_limit,),
    abstraction=lambda counter: counter.to_spec(),
    spec=Counter,
    drain=lambda state: [Reset()],
    drained=lambda state: state.value == 0,
    corpora=(Corpus("counter", "tests.testing.test_toy_component:BROKEN"),),
)
SETTINGS = bounded(50, 10, shrink=False)


def run(factory: Any, reference: Any | None) -> None:
    machine = machine_for(COUNTER, factory, reference, LIMIT)
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


def test_the_machine_passes_the_counter_and_catches_the_broken_one() -> None:
    run(Counter, Counter)
    with pytest.raises(CheckFailed) as alone:
        run(PastTheLimit, None)
    assert alone.value.failure.kind is FailureKind.INVARIANT
    with pytest.raises(CheckFailed) as lockstep:
        run(PastTheLimit, Counter)
    assert lockstep.value.failure.kind is FailureKind.LOCKSTEP


def test_the_explorer_passes_the_counter_and_catches_the_broken_one() -> None:
    result = ComponentExplorer(COUNTER, LIMIT, Counter, Counter).run()
    assert result.complete and result.violation is None and result.states == LIMIT + 1
    alone = ComponentExplorer(COUNTER, LIMIT, PastTheLimit).run().violation
    assert alone is not None and alone.kind is FailureKind.INVARIANT
    assert len(alone.path) == LIMIT and isinstance(alone.event, Increment)  # shortest
    assert all(isinstance(event, Increment) for event in alone.path)
    lockstep = ComponentExplorer(COUNTER, LIMIT, PastTheLimit, Counter).run().violation
    assert lockstep is not None and lockstep.kind is FailureKind.LOCKSTEP


def test_the_step_checker_judges_a_counter_step() -> None:
    counter = PastTheLimit(LIMIT)
    counter.value = LIMIT
    before = counter.to_spec()
    outcome = capture(counter.increment)
    failure = check_step(before, Increment(), outcome, counter.to_spec(), component=COUNTER)
    assert failure is not None and failure.kind is FailureKind.INVARIANT
    refused = capture(Counter(0).increment)
    assert check_step(CounterState(0, 0), Increment(), refused, CounterState(0, 0), component=COUNTER) is None
    changed = check_step(CounterState(0, 0), Increment(), refused, CounterState(1, 0), component=COUNTER)
    assert changed is not None and changed.kind is FailureKind.ATOMICITY


@dataclass(frozen=True)
class ToyBug:
    id: str
    counter: str | None = None


def test_the_catalogue_lists_the_counters_corpus() -> None:
    assert listing_problems([ToyBug("past-the-limit", counter="PastTheLimit")], COUNTER.corpora) == []
    assert listing_problems([ToyBug("nothing")], COUNTER.corpora) != []
