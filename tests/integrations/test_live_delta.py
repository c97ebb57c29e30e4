"""The live checker on what each step changed (`kvsched.integrations.vllm.live_delta`), on views
written by hand: a consistent step is read without the whole check; a step broken where it
changed the pool sends the whole check at once, which names it; a break where no step changed
anything is found at the next whole check; a reading weakened at an edge misses one. vLLM's own
scheduler with broken pools: `make vllm` (`devtools/vllm/checker_teeth.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from kvsched.integrations.vllm import live_delta
from kvsched.integrations.vllm.live import Held, PoolView
from kvsched.integrations.vllm.live_delta import DeltaChecker
from kvsched.spec.kv_events import KvEvent, Removed, Stored
from tests.helpers import weakened
from tests.integrations.test_live_checker import A0, A1, B1, Map, Seen, X, view

NEVER = 1_000  # steps between whole checks: none but the first in these tests


def b_grown() -> PoolView:
    """Request b takes the free uncached block 5 for its third block."""
    b = Held("b", 0, (1, 4, 5), 1, (A0, B1), (1, 2, 7, 8, 9, 10), 2)
    return view(held=(view().held[0], b), ref_counts=(0, 2, 1, 1, 1, 1, 0), free_queue=(6,), free_count=1)


def b_cached() -> PoolView:
    """Request b's block 1 (block 4) is cached under B1, its tokens' key."""
    b = replace(view().held[1], cached=2)
    keys = (None, A0, A1, None, B1, None, X)
    return view(held=(view().held[0], b), keys=keys, cache_map=Map({A0: {1}, A1: {2}, B1: {4}, X: {6}}))


def b_gone() -> PoolView:
    """Request b left: its own block 4 (uncached) freed to the queue's front, block 1 kept by a."""
    return view(held=view().held[:1], ref_counts=(0, 1, 1, 1, 0, 0, 0), free_queue=(4, 5, 6), free_count=3)


def b_takes_cached() -> PoolView:
    """Request b takes the free block 6, cached under X, evicting X."""
    b = Held("b", 0, (1, 4, 6), 1, (A0, B1), (1, 2, 7, 8, 9, 10), 2)
    return view(
        held=(view().held[0], b),
        ref_counts=(0, 2, 1, 1, 1, 0, 1),
        free_queue=(5,),
        free_count=1,
        keys=(None, A0, A1, None, None, None, None),
        cache_map=Map({A0: {1}, A1: {2}}),
    )


def c_added(salt: object = None) -> PoolView:
    """A new request c hits block 1 (A0) and takes block 5."""
    c = Held("c", 0, (1, 5), 1, (A0,), (1, 2, 3), 2, salt)
    return view(held=(*view().held, c), ref_counts=(0, 3, 1, 1, 1, 1, 0), free_queue=(6,), free_count=1)


CONSISTENT: dict[str, Callable[[], PoolView]] = {
    "a table grows": b_grown,
    "a block is cached": b_cached,
    "a request leaves": b_gone,
    "a cached free block is taken, its key evicted": b_takes_cached,
    "a request arrives with a prefix hit": c_added,
}

# Each step broken where it changed the pool, and the finding the whole check it sends must give.
BROKEN: dict[str, tuple[Callable[[], PoolView], tuple[str, str | None, int | None]]] = {
    "the block a table gained, its count not raised": (
        lambda: replace(b_grown(), ref_counts=(0, 2, 1, 1, 1, 0, 0)),
        ("refcount", "b", 5),
    ),
    "the block a table gained, still queued": (
        lambda: replace(b_grown(), free_queue=(5, 6), free_count=2),
        ("free_in_table", "b", 5),
    ),
    "the block a request freed, not queued": (
        lambda: replace(b_gone(), free_queue=(5, 6), free_count=2),
        ("free_queue", None, 4),
    ),
    "the shared block a request freed, freed twice": (
        lambda: replace(b_gone(), ref_counts=(0, 0, 1, 1, 0, 0, 0), free_queue=(1, 4, 5, 6), free_count=4),
        ("free_in_table", "a", 1),
    ),
    "the block a request freed, queued twice": (
        lambda: replace(b_gone(), free_queue=(4, 5, 6, 4), free_count=4),
        ("free_queue", None, 4),
    ),
    "the block a request freed, uncached behind a cached one": (
        lambda: replace(b_gone(), free_queue=(5, 6, 4)),
        ("free_order", None, 4),
    ),
    "a cached block handed out keeping its key": (
        lambda: replace(b_takes_cached(), keys=view().keys, cache_map=view().cache_map),
        ("stale_key", "b", 6),
    ),
    "a cached block handed out, its key dropped, the map naming it still": (
        lambda: replace(b_takes_cached(), cache_map=view().cache_map),
        ("cache_map", None, 6),
    ),
    "a block counted cached without its tokens' key": (
        lambda: replace(b_cached(), keys=view().keys, cache_map=view().cache_map),
        ("ghost_content", "b", 4),
    ),
    "a prefix hit under another salt": (lambda: c_added(salt="tenant-b"), ("salt", "c", 1)),
}


def run(steps: Sequence[PoolView], checker: DeltaChecker | None = None) -> tuple[DeltaChecker, Seen]:
    """`steps` checked in turn; what the last step found."""
    checker = checker or DeltaChecker(NEVER)
    findings = set()
    for step in steps:
        findings = {(f.check, f.request_id, f.block_id) for f in checker.check(step)}
    return checker, findings


@pytest.mark.parametrize("name", list(CONSISTENT))
def test_a_consistent_step_is_read_without_the_whole_check(name: str) -> None:
    checker, findings = run([view(), CONSISTENT[name]()])
    assert findings == set() and checker.whole_checks == 1
    checker, findings = run([CONSISTENT[name](), view()])  # and back
    assert findings == set() and checker.whole_checks == 1


def test_steps_one_after_another_keep_what_they_read() -> None:
    grown_then_cached = replace(
        b_grown(),
        held=(view().held[0], replace(b_grown().held[1], cached=2)),
        keys=(None, A0, A1, None, B1, None, X),
        cache_map=Map({A0: {1}, A1: {2}, B1: {4}, X: {6}}),
    )
    checker, findings = run([view(), b_grown(), grown_then_cached, b_grown(), view(), b_gone(), view()])
    assert findings == set() and checker.whole_checks == 1


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_step_broken_where_it_changed_the_pool_is_found_at_once(name: str) -> None:
    broken, expected = BROKEN[name]
    checker, findings = run([view(), broken()])
    assert expected in findings and checker.whole_checks == 2


def test_a_finished_request_that_still_holds_its_blocks() -> None:
    checker = DeltaChecker(NEVER)
    run([view()], checker)
    checker.request_finished("b")
    _, findings = run([view()], checker)
    assert ("finished_leftover", "b", 1) in findings and checker.whole_checks == 2
    checker = DeltaChecker(NEVER)
    run([view()], checker)
    checker.request_finished("b")
    assert run([b_gone()], checker)[1] == set() and checker.whole_checks == 1


def test_a_break_no_step_touched_is_found_at_the_next_whole_check() -> None:
    """Block 6's count raised while nothing holds it or changed it: the step does not read it."""
    off = view(ref_counts=(0, 2, 1, 1, 1, 0, 1))
    checker = DeltaChecker(3)  # the whole check at steps 1, 4, 7, ...
    assert run([view(), off, off], checker)[1] == set()
    assert ("refcount", None, 6) in run([off], checker)[1] and checker.whole_checks == 2


def test_the_events_net_change_is_the_blocks_net_change_of_keys() -> None:
    cases: list[tuple[Callable[[], PoolView], list[KvEvent], bool]] = [
        (b_cached, [Stored(B1, A0, 2)], True),
        (b_takes_cached, [Removed(X)], True),
        (b_cached, [], False),  # the store not published
        (b_takes_cached, [Removed(X), Stored(X, None, 2)], False),  # vLLM #49125's shape
        (b_cached, [Stored(B1, A0, 2), Stored(B1, A0, 2)], False),  # published twice
        (b_takes_cached, [Removed(A1)], False),  # another block's key removed
    ]
    for step, events, consistent in cases:
        checker = DeltaChecker(NEVER)
        checker.check(view(), [])
        findings = checker.check(step(), events)
        assert ([f.check for f in findings] == []) is consistent, events
        assert checker.whole_checks == (1 if consistent else 2), events
    checker = DeltaChecker(NEVER)
    checker.check(view(), [])
    findings = checker.check(view(), [Removed(B1)])  # a removal no event stored
    assert [f.check for f in findings] == ["kv_events"]


def test_every_step_whole_when_asked_and_never_less_than_one() -> None:
    checker, _ = run([view(), b_grown(), view()], DeltaChecker(1))
    assert checker.whole_checks == 3
    with pytest.raises(ValueError, match="every N >= 1"):
        DeltaChecker(0)


def caught_all(checker: type[DeltaChecker]) -> bool:
    """`checker` finds every broken step at once and is silent on every consistent one."""
    return all(expected in run([view(), broken()], checker(NEVER))[1] for broken, expected in BROKEN.values()) and all(
        run([view(), step()], checker(NEVER))[1] == set() for step in CONSISTENT.values()
    )


# Readings weakened at an edge: the last block touched, the last request changed, the last block
# past a request's cached ones, the last key a block lost.
WEAKENED = [
    ("        for block in dirty:\n", "        for block in sorted(dirty)[:-1]:\n"),
    ("        for request_id, group, start in changed:", "        for request_id, group, start in changed[:-1]:"),
    ("range(held.cached, len(held.blocks))", "range(held.cached, len(held.blocks) - 1)"),
    ("                for key in old:\n", "                for key in old[:-1]:\n"),
]


@pytest.mark.parametrize("change", WEAKENED, ids=[f"weakened-{index}" for index in range(len(WEAKENED))])
def test_a_reading_weakened_at_an_edge_misses_one(change: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert caught_all(DeltaChecker)
    assert not caught_all(weakened(live_delta, *change, monkeypatch).DeltaChecker)
