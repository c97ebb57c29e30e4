"""Every check of the harness fails a state wrong only at its edge: the last page of a table, the
last position, the last request, the last holder, the last host page, the last lease, the last
copy in flight. And every check weakened at that edge (its loop stopping one short) fails a test:
the meta-test below weakens each one as a text edit of its own source and requires its edge test
to fail then.

Each edge is a function returning two verdicts, (the correct state is flagged, the state wrong
at the edge is flagged); a check is right there exactly when they are (False, True)."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from devtools import cow_toy, offload_toy
from kvsched.spec import invariants
from kvsched.spec.kv_events import HOST, Stored
from kvsched.spec.slots import RequestState, SchedulerState, Slot
from kvsched.testing import CheckFailed, FailureKind, PoolView, SafetyMachine
from kvsched.testing.adapters import kvsched_parts
from kvsched.testing.components import manager, system
from kvsched.testing.engine_model import HarnessModel
from kvsched.testing.ghost import GhostMemory
from kvsched.testing.safety_copies import CopiesInFlight, Flight

Verdicts = tuple[bool, bool]  # (the correct state flagged, the state wrong at the edge flagged)
PAGE = 2


def _fails(kind: FailureKind, call: Callable[[], object]) -> bool:
    """`call` fails the harness's check of `kind` (another check failing is a test error)."""
    try:
        call()
    except CheckFailed as error:
        assert error.failure.kind is kind, error.failure
        return True
    return False


# -- the edges ------------------------------------------------------------------------------------


def ghost_reads() -> Verdicts:
    """The system harness's and the engine machine's ghost reads (`GhostMemory.mismatches`): two
    live requests of two written pages each; only the last position of the last request's last
    page holds another history."""
    histories = {1: (10, 11, 12, 13), 2: (20, 21, 22, 23)}
    written = {1: (0, 1), 2: (2, 3)}
    tables = {request_id: (*pages, None) for request_id, pages in written.items()}
    scheduler = SchedulerState(tuple(Slot(t, r, RequestState.DECODE, 4) for r, t in tables.items()))

    def flagged(wrong: bool) -> bool:
        memory = GhostMemory(PAGE)
        for request_id, history in histories.items():
            for position in range(len(history)):
                memory.write(written[request_id][position // PAGE], position, history[: position + 1])
        memory.histories = dict(histories)
        if wrong:
            memory.write(3, 3, (20, 21, 22, 99))
        return bool(memory.mismatches(scheduler))

    return flagged(False), flagged(True)


def safety_reads() -> Verdicts:
    """Safety mode's reads: a request's last computed position holds another context's KV when it
    decodes its next token."""

    def flagged(wrong: bool) -> bool:
        machine = SafetyMachine(cow_toy.correct, pages=8, page_size=PAGE)
        machine.submit(1, (0, 0, 1, 1))
        if wrong:
            machine.kv[machine.manager.view().tables[1][-1]][1] = (0, 0, 1, 2)
        return _fails(FailureKind.GHOST, lambda: machine.decode(1))

    return flagged(False), flagged(True)


def safety_exclusive() -> Verdicts:
    """Safety mode's exclusive writes: a parent decodes into the half-full page it shares with its
    fork, the last other holder (the planted `in_place` bug) or into its own copy (correct)."""

    def flagged(factory: Callable[[int, int], Any]) -> bool:
        machine = SafetyMachine(factory, pages=8, page_size=PAGE)
        machine.submit(1, (0, 0, 1))
        machine.fork(1, 2)
        return _fails(FailureKind.EXCLUSIVE, lambda: machine.decode(1))

    return flagged(cow_toy.correct), flagged(cow_toy.in_place)


def round_exclusive() -> Verdicts:
    """The system harness's exclusive writes of a committed round: only the last slot's token
    lands in a page another owner holds."""
    tables = {1: (0, 1, None), 2: (2, 3, None)}

    def state(count: int, refs: tuple[int, ...]) -> Any:
        slots = tuple(Slot(t, r, RequestState.DECODE, count) for r, t in tables.items())
        return SimpleNamespace(scheduler=SchedulerState(slots), pool=SimpleNamespace(refs=refs))

    def flagged(refs: tuple[int, ...]) -> bool:
        return system.round_wrote_shared(state(3, refs), state(4, refs), PAGE) is not None

    return flagged((1, 1, 1, 1)), flagged((1, 1, 1, 2))


def _manager_state(view: PoolView, live: tuple[tuple[int, int], ...]) -> manager.ManagerState:
    return manager.ManagerState(view, live, len(view.holders), PAGE)


def view_counts() -> Verdicts:
    """Safety mode's holder counts: only the last page's count is wrong."""
    tables = {1: (0, 1), 2: (2, 3)}

    def flagged(holders: tuple[int, ...]) -> bool:
        return bool(manager.view_problems(_manager_state(PoolView(holders, frozenset(), tables), ((1, 4), (2, 4)))))

    return flagged((1, 1, 1, 1)), flagged((1, 1, 1, 0))


def view_leases() -> Verdicts:
    """Safety mode's leases: only the last leased page is free."""

    def flagged(free: frozenset[int]) -> bool:
        view = PoolView((1, 1, 0, 0), free, {1: (0, 1)}, leased={2: 1, 3: 1})
        return bool(manager.view_problems(_manager_state(view, ((1, 4),))))

    return flagged(frozenset()), flagged(frozenset({3}))


def lease_reads() -> Verdicts:
    """Safety mode's lease reads: only the last page a lease saw was written over since."""

    def flagged(wrong: bool) -> bool:
        machine = SafetyMachine(cow_toy.correct, pages=8, page_size=PAGE)
        seen: dict[int, dict[int, tuple[int, ...]]] = {0: {0: (1,), 1: (1, 2)}, 1: {0: (1, 2, 3)}}
        machine.kv = {page: dict(slots) for page, slots in seen.items()}
        if wrong:
            machine.kv[1][0] = (7,)
        return _fails(FailureKind.GHOST, lambda: machine._read_lease(1, seen))

    return flagged(False), flagged(True)


def host_pages() -> Verdicts:
    """Safety mode's host tier: only the last host page is neither free nor keyed (lost)."""

    def flagged(host_free: frozenset[int]) -> bool:
        view = PoolView((0, 0), frozenset({0, 1}), {}, host={0: "a", 1: "b"}, host_free=host_free, host_pages=3)
        return bool(manager.host_problems(view))

    return flagged(frozenset({2})), flagged(frozenset())


def free_stack() -> Verdicts:
    """The system's free stack: only the last page, unheld, is missing from it."""

    def flagged(free: tuple[int, ...]) -> bool:
        state: Any = SimpleNamespace(pool=SimpleNamespace(free=free, refs=(0, 1, 0)))
        return not invariants.inv_free_stack_exact(state)

    return flagged((0, 2)), flagged((0,))


def copies_in_flight() -> Verdicts:
    """The engine machine's copies in flight: only the last copy the backend runs is one the
    engine no longer tracks."""
    model = HarnessModel(PAGE)
    model.in_flight = {1: (True, 0, 0), 2: (False, 1, 3)}
    return bool(model.forgotten({1, 2})), bool(model.forgotten({1}))


def safety_copies_in_flight() -> Verdicts:
    """Safety mode's copies in flight ("async_copies"): two stores fly; only the last one's page is
    free (the manager could hand it out while the copy reads it)."""

    def flagged(free: frozenset[int]) -> bool:
        machine = SafetyMachine(offload_toy.asynchronous, pages=8, page_size=PAGE)
        assert machine.copies is not None
        machine.copies.flights = {1: Flight(0, 0, True, "a", None), 2: Flight(1, 1, True, "b", None)}
        view = PoolView(
            (0,) * 8,
            free | frozenset(range(2, 8)),
            {},
            cached={0: "a", 1: "b"},
            host_free=frozenset(range(2, 8)),
            host_pages=8,
            host_pending=frozenset({0, 1}),
            in_flight={1: (0, 0, True), 2: (1, 1, True)},
        )
        return _fails(FailureKind.INVARIANT, lambda: machine.copies.observe(view) if machine.copies else None)

    return flagged(frozenset()), flagged(frozenset({1}))


def safety_events() -> Verdicts:
    """Safety mode's KV events ("events"): a store on each tier; only the last event (the host
    store) names a key the view does not cache."""

    def flagged(last: str) -> bool:
        machine = SafetyMachine(kvsched_parts.manager, pages=8, page_size=PAGE)
        events = [Stored("a", None, PAGE), Stored(last, None, PAGE, HOST)]
        machine.manager._manager.events = lambda: events
        view = PoolView(
            (0,) * 8,
            frozenset(range(8)),
            {},
            cached={0: "a"},
            host={0: "b"},
            host_free=frozenset(range(1, 8)),
            host_pages=8,
        )
        return _fails(FailureKind.EVENTS, lambda: machine._events(view))

    return flagged("b"), flagged("z")


EDGES: dict[str, Callable[[], Verdicts]] = {
    edge.__name__: edge
    for edge in (
        ghost_reads,
        safety_reads,
        safety_exclusive,
        round_exclusive,
        view_counts,
        view_leases,
        lease_reads,
        host_pages,
        free_stack,
        copies_in_flight,
        safety_copies_in_flight,
        safety_events,
    )
}


@pytest.mark.parametrize("edge", sorted(EDGES))
def test_each_check_fails_a_state_wrong_only_at_its_edge(edge: str) -> None:
    assert EDGES[edge]() == (False, True)


# -- the checks weakened at their edges ---------------------------------------------------------------


@dataclass(frozen=True)
class Weakening:
    """A check's loop stopping one short: `old` replaced by `new` in `owner.name`'s source."""

    edge: str
    owner: type | ModuleType
    name: str
    old: str
    new: str


WEAKENINGS = (
    Weakening(
        "ghost_reads", GhostMemory, "mismatches", "for slot in scheduler.slots:", "for slot in scheduler.slots[:-1]:"
    ),
    Weakening(
        "ghost_reads",
        GhostMemory,
        "mismatches",
        "enumerate(history):",
        "enumerate(history[: (len(history) - 1) // self.page_size * self.page_size]):",
    ),
    Weakening("ghost_reads", GhostMemory, "mismatches", "enumerate(history):", "enumerate(history[:-1]):"),
    Weakening("safety_reads", SafetyMachine, "_read", "range(first, stop)", "range(first, stop - 1)"),
    Weakening("safety_exclusive", SafetyMachine, "_holding", "view.tables.items()", "list(view.tables.items())[:-1]"),
    Weakening(
        "round_exclusive",
        system,
        "round_wrote_shared",
        "zip(before.scheduler.slots, after.scheduler.slots, strict=True)",
        "zip(before.scheduler.slots[:-1], after.scheduler.slots[:-1], strict=True)",
    ),
    Weakening(
        "view_counts",
        manager,
        "view_problems",
        "zip(view.holders, counts, strict=True)",
        "zip(view.holders[:-1], counts[:-1], strict=True)",
    ),
    Weakening(
        "view_leases", manager, "view_problems", "sorted(view.leased.items())", "sorted(view.leased.items())[:-1]"
    ),
    Weakening("lease_reads", SafetyMachine, "_read_lease", "sorted(seen.items())", "sorted(seen.items())[:-1]"),
    Weakening("host_pages", manager, "host_problems", "range(view.host_pages)", "range(view.host_pages - 1)"),
    Weakening(
        "free_stack",
        invariants,
        "inv_free_stack_exact",
        "enumerate(state.pool.refs)",
        "enumerate(state.pool.refs[:-1])",
    ),
    Weakening(
        "copies_in_flight", HarnessModel, "forgotten", "self.in_flight.items()", "list(self.in_flight.items())[:-1]"
    ),
    Weakening(
        "safety_copies_in_flight",
        CopiesInFlight,
        "observe",
        "for copy_id, flight in sorted(self.flights.items()):",
        "for copy_id, flight in sorted(self.flights.items())[:-1]:",
    ),
    Weakening(
        "safety_events",
        SafetyMachine,
        "_events",
        "fold_counted(self.published, events)",
        "fold_counted(self.published, events[:-1])",
    ),
    Weakening(
        "safety_events",
        SafetyMachine,
        "_events",
        "cached.update((key, HOST) for key in view.host.values())",
        "cached.update((key, HOST) for key in list(view.host.values())[:-1])",
    ),
)


@contextmanager
def weakened(weakening: Weakening) -> Iterator[None]:
    """`weakening` in force: its function compiled again from its edited source, in its module."""
    original = vars(weakening.owner)[weakening.name]
    source = textwrap.dedent(inspect.getsource(original))
    assert source.count(weakening.old) == 1, f"{weakening.old!r} is not once in {weakening.name}"
    namespace = dict(original.__globals__)
    exec(compile(source.replace(weakening.old, weakening.new), inspect.getfile(original), "exec"), namespace)
    setattr(weakening.owner, weakening.name, namespace[weakening.name])
    try:
        yield
    finally:
        setattr(weakening.owner, weakening.name, original)


@pytest.mark.parametrize("weakening", WEAKENINGS, ids=lambda w: f"{w.edge}:{w.new}")
def test_a_check_weakened_at_its_edge_fails_its_edge_test(weakening: Weakening) -> None:
    with weakened(weakening):
        verdicts = EDGES[weakening.edge]()
    assert verdicts != (False, True)
    assert EDGES[weakening.edge]() == (False, True)  # and the check is whole again


def test_every_edge_has_a_weakening() -> None:
    assert {weakening.edge for weakening in WEAKENINGS} == set(EDGES)
