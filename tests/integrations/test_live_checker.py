"""The live checker's checks (`kvsched.integrations.vllm.live`) on views written by hand: silent
on a consistent pool, and each check failing on a view broken at its edge (the last block, the
last request, the queue's tail). vLLM's own scheduler with broken pools: `make vllm`."""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import Any

import pytest

from kvsched.integrations.vllm import live
from kvsched.integrations.vllm.events import EventWatch
from kvsched.integrations.vllm.live import Finding, Held, LiveChecker, PoolView
from kvsched.spec.kv_events import DEVICE, Cleared, Entry, KvEvent, Removed, Stored
from kvsched.spec.kv_layout import Chunked, Group, Window
from tests.helpers import weakened

A0, A1, A2, B1, X = b"a0", b"a1", b"a2", b"b1", b"x"


class Map:
    """A hash map: key -> the block ids it names."""

    def __init__(self, blocks: dict[bytes, set[int]]) -> None:
        self.blocks = blocks

    def holds(self, key: bytes, block: int) -> bool:
        return block in self.blocks.get(key, set())

    def pairs(self) -> int:
        return sum(len(blocks) for blocks in self.blocks.values())

    def distinct(self) -> int:
        return sum(1 for blocks in self.blocks.values() if blocks)

    def names(self) -> dict[bytes, int] | None:
        if any(len(blocks) != 1 for blocks in self.blocks.values()):
            return None
        return {key: next(iter(blocks)) for key, blocks in self.blocks.items()}

    def entries(self) -> Iterable[tuple[bytes, Collection[int]]]:
        return self.blocks.items()


def view(**changes: Any) -> PoolView:
    """Blocks 0 (null) to 6. Request a holds 1, 2, 3 (its first two cached); request b shares
    block 1 (the same first tokens) and holds 4; 5 is free, 6 is free and cached under X."""
    held = (
        Held("a", 0, (1, 2, 3), 2, (A0, A1, A2), (1, 2, 3, 4, 5, 6), 2),
        Held("b", 0, (1, 4), 1, (A0, B1), (1, 2, 7, 8), 2),
    )
    base = PoolView(
        ref_counts=(0, 2, 1, 1, 1, 0, 0),
        null_block=0,
        free_queue=(5, 6),
        free_count=2,
        keys=(None, A0, A1, None, None, None, X),
        extra_keys={},
        cache_map=Map({A0: {1}, A1: {2}, X: {6}}),
        held=held,
    )
    return replace(base, **changes)


Seen = set[tuple[str, str | None, int | None]]


def found(pool: PoolView, checker: LiveChecker | None = None) -> Seen:
    findings: list[Finding] = (checker or LiveChecker()).check(pool)
    return {(finding.check, finding.request_id, finding.block_id) for finding in findings}


def ghost_changed(checker: type[LiveChecker]) -> Seen:
    """A key seen over A0's tokens, then over other tokens (in the last request)."""
    first = checker()
    first.check(view())
    later = replace(view().held[1], tokens=(9, 9, 7, 8))
    return found(view(held=(view().held[0], later)), checker(ghosts=first.ghosts))


def finished_holds(checker: type[LiveChecker]) -> Seen:
    """The last request finished, yet holds its blocks."""
    done = checker()
    done.request_finished("b")
    return found(view(), done)


def moved_cached_block() -> PoolView:
    """The last request's cached block 0 is block 2, which carries A1, not its tokens' A0."""
    held = view().held[:1] + (replace(view().held[1], blocks=(2, 4), tokens=(3, 4, 7, 8)),)
    return view(held=held, ref_counts=(0, 1, 2, 1, 1, 0, 0))


def storing_last() -> PoolView:
    """A connector's store reads the last block (free and cached under X): it holds it, out of the
    free queue, until the copy lands."""
    return view(ref_counts=(0, 2, 1, 1, 1, 0, 1), free_queue=(5,), free_count=1, pinned={6: 1}, storing=(6,))


def loading_into_last_request() -> PoolView:
    """A connector's load writes the last request's last block: the connector holds it too, and it
    carries no key until the copy lands."""
    return view(ref_counts=(0, 2, 1, 1, 2, 0, 0), pinned={4: 1}, writing=(4,))


def stored_then_freed_to_front(key: bytes = X) -> Seen:
    """The last block, stored while free, then freed back to the queue's front under `key`."""
    checker = LiveChecker()
    assert found(storing_last(), checker) == set()
    keys = (None, A0, A1, None, None, None, key)
    return found(view(free_queue=(6, 5), keys=keys, cache_map=Map({A0: {1}, A1: {2}, key: {6}})), checker)


# Each broken view, and the finding it must give (check, request, block): broken at the edge.
BROKEN: dict[str, tuple[Callable[[], PoolView], tuple[str, str | None, int | None]]] = {
    "count off on the last block": (lambda: view(ref_counts=(0, 2, 1, 1, 1, 0, 1)), ("refcount", None, 6)),
    "count off on the last request's last block": (
        lambda: view(ref_counts=(0, 2, 1, 1, 2, 0, 0)),
        ("refcount", "b", 4),
    ),
    "the last request's block queued, counted 0": (
        lambda: view(ref_counts=(0, 2, 1, 1, 0, 0, 0), free_queue=(4, 5, 6), free_count=3),
        ("free_in_table", "b", 4),
    ),
    "the last request's block queued at the tail": (
        lambda: view(free_queue=(5, 6, 4), free_count=3),
        ("free_in_table", "b", 4),
    ),
    "the tail queued twice": (lambda: view(free_queue=(5, 6, 6), free_count=3), ("free_queue", None, 6)),
    "the walk lost the tail": (lambda: view(free_queue=(5,), free_count=2), ("free_queue", None, None)),
    "the last block free, not queued": (lambda: view(free_queue=(5,), free_count=1), ("free_queue", None, 6)),
    "the null block queued": (lambda: view(free_queue=(0, 5, 6), free_count=3), ("free_queue", None, 0)),
    "uncached behind cached": (lambda: view(free_queue=(6, 5)), ("free_order", None, 5)),
    "a stale map entry": (
        lambda: view(cache_map=Map({A0: {1}, A1: {2}, X: {6, 5}})),
        ("cache_map", None, 5),
    ),
    "the last block's key unnamed": (lambda: view(cache_map=Map({A0: {1}, A1: {2}})), ("cache_map", None, 6)),
    "the last request's cached block without its key": (moved_cached_block, ("ghost_content", "b", 2)),
    "the last request's block past its cached ones carries a key": (
        lambda: view(keys=(None, A0, A1, None, X, None, None), cache_map=Map({A0: {1}, A1: {2}, X: {4}})),
        ("stale_key", "b", 4),
    ),
    "the last block a store reads, queued free": (
        lambda: replace(storing_last(), free_queue=(5, 6), free_count=2),
        ("copy_in_flight", None, 6),
    ),
    "the last block a store reads, its hold not counted": (
        lambda: replace(storing_last(), ref_counts=(0, 2, 1, 1, 1, 0, 0), free_queue=(5,), free_count=1),
        ("refcount", None, 6),
    ),
    "the last request's block a load writes, its hold not counted": (
        lambda: replace(loading_into_last_request(), ref_counts=(0, 2, 1, 1, 1, 0, 0)),
        ("refcount", "b", 4),
    ),
    "a load writes the last block, which carries a key": (
        lambda: view(ref_counts=(0, 2, 1, 1, 1, 0, 1), free_queue=(5,), free_count=1, pinned={6: 1}, writing=(6,)),
        ("copy_in_flight", None, 6),
    ),
    "the last request's key under another salt": (
        lambda: view(held=(view().held[0], replace(view().held[1], salt="tenant-b"))),
        ("salt", "b", 1),
    ),
}


def test_a_consistent_pool_has_no_finding() -> None:
    checker = LiveChecker()
    assert found(view(), checker) == set()
    assert found(view(), checker) == set()  # and again, with the keys' ghosts known


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_broken_view_is_found(name: str) -> None:
    broken, expected = BROKEN[name]
    assert expected in found(broken())


def test_a_block_just_filled_may_carry_its_own_key_before_its_count_catches_up() -> None:
    keys = (None, A0, A1, A2, None, None, X)  # request a's block 2, past its 2 cached: A2, its own
    assert found(view(keys=keys, cache_map=Map({A0: {1}, A1: {2}, A2: {3}, X: {6}}))) == set()


def test_copies_in_flight_hold_their_blocks() -> None:
    assert found(storing_last()) == set()
    assert found(loading_into_last_request()) == set()


def test_a_stored_block_may_go_back_to_the_front_under_the_key_stored() -> None:
    assert stored_then_freed_to_front() == set()
    assert found(view(free_queue=(6, 5))) == {("free_order", None, 5)}  # never seen stored
    assert stored_then_freed_to_front(b"other") == {("free_order", None, 5)}  # its key changed since


def test_a_stored_block_taken_by_a_request_is_ordered_again() -> None:
    checker = LiveChecker()
    found(storing_last(), checker)
    assert checker.stored == {6: X}
    held = (view().held[0], replace(view().held[1], blocks=(1, 4, 6)))
    found(view(held=held, ref_counts=(0, 2, 1, 1, 1, 0, 1), free_queue=(5,), free_count=1), checker)
    assert checker.stored == {}


def test_a_key_that_names_other_tokens_than_when_first_seen() -> None:
    assert ("ghost_content", "b", 1) in ghost_changed(LiveChecker)


def test_a_finished_request_that_still_holds_blocks() -> None:
    assert ("finished_leftover", "b", 1) in finished_holds(LiveChecker)
    checker = LiveChecker()
    checker.request_finished("b")
    checker.request_added("b")  # the id came back as a new request
    assert found(view(), checker) == set()


def test_every_check_has_a_broken_view() -> None:
    expected = {check for _, (check, _, _) in BROKEN.values()}
    expected |= {"ghost_content", "finished_leftover", "kv_events", "window_read", "state_read"}
    assert expected == set(live.CHECKS)


def test_a_masked_groups_cached_block_may_carry_no_key_but_never_another() -> None:
    """A sliding window's cached block that no later hit can use is left without a key (vLLM's
    `reachable_block_mask`): no finding in a masked group, a finding in a full one; a key other
    than its tokens' is a finding in either."""
    unkeyed = view(keys=(None, A0, None, None, None, None, X), cache_map=Map({A0: {1}, X: {6}}))
    masked = (replace(unkeyed.held[0], masked=True), unkeyed.held[1])
    assert found(replace(unkeyed, held=masked)) == set()
    assert ("ghost_content", "a", 2) in found(unkeyed)
    assert ("ghost_content", "b", 2) in found(
        replace(moved_cached_block(), held=tuple(replace(held, masked=True) for held in moved_cached_block().held))
    )


WINDOW = Window(4)


def window_pass(table: tuple[int, ...], request_id: str = "a", group: Group = WINDOW) -> live.Pass:
    """A pass over positions 9 and 10, blocks of 2 positions: in a window of 4, its first query
    reads from position 6 (block 3); it writes through block 5. The table's null block is 0."""
    first = live.Pass(request_id, 1, group, 2, 9, 2, (), len(table))
    return replace(first, blocks=table[first.first : first.end])


def window_reads(passes: list[live.Pass], checker: Any = live) -> Seen:
    return {(f.check, f.request_id, f.block_id) for f in checker.window_findings(passes, 0)}


def window_caught_all(checker: Any) -> bool:
    """`checker` finds each broken pass below: the null block first read, last written, a short table."""
    good = window_pass((0, 0, 0, 7, 8, 9), "a")
    return (
        window_reads([good, window_pass((0, 0, 0, 0, 8, 9), "b")], checker) == {("window_read", "b", 0)}
        and window_reads([good, window_pass((0, 0, 0, 7, 8, 0), "b")], checker) == {("window_read", "b", 0)}
        and window_reads([good, window_pass((0, 0, 0, 7, 8), "b")], checker) == {("window_read", "b", None)}
    )


def test_a_pass_reads_real_blocks_through_its_window() -> None:
    assert window_reads([window_pass((0, 0, 0, 7, 8, 9))]) == set()
    assert window_pass((0, 0, 0, 7, 8, 9)).blocks == (7, 8, 9)
    assert window_reads([window_pass((0, 0, 0, 0, 8, 9))]) == {("window_read", "a", 0)}
    assert window_caught_all(live)


def test_a_replayed_window_is_read_from_its_replay_start_only() -> None:
    """vLLM's bounded replay: after a prefix hit the request holds the window's KV from
    `replay_start` on only (the worker rebuilds it from there), so blocks below it may be null."""
    replayed = replace(window_pass((0, 0, 0, 0, 8, 9)), start=8)
    assert replayed.first == 4
    assert window_reads([replace(replayed, blocks=(8, 9))]) == set()
    assert window_reads([window_pass((0, 0, 0, 0, 8, 9))]) == {("window_read", "a", 0)}


def test_a_chunk_reads_from_its_own_start() -> None:
    """Chunks of 4 positions: the query at 9 reads from 8 (block 4), so block 3 may be null."""
    assert window_pass((0, 0, 0, 0, 8, 9), group=Chunked(4)).first == 4
    assert window_reads([window_pass((0, 0, 0, 0, 8, 9), group=Chunked(4))]) == set()
    assert window_reads([window_pass((0, 0, 0, 0, 0, 9), group=Chunked(4))]) == {("window_read", "a", 0)}


WINDOW_WEAKENED = [
    ("    for step in passes:\n        if step.length", "    for step in list(passes)[:-1]:\n        if step.length"),
    ("step.blocks[: step.end - step.first]", "step.blocks[: step.end - step.first - 1]"),
    ("if step.length < step.end:", "if step.length < step.end - 1:"),
]


@pytest.mark.parametrize("change", WINDOW_WEAKENED, ids=[f"window-weakened-{n}" for n in range(len(WINDOW_WEAKENED))])
def test_the_window_check_weakened_at_an_edge_misses_one(
    change: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert window_caught_all(live)
    assert not window_caught_all(weakened(live, *change, monkeypatch))


def state_pass(table: tuple[int, ...], request_id: str = "a", position: int = 4, tokens: int = 3) -> live.StatePass:
    """A pass over positions 4 to 6 by default, blocks of 2 positions: it resumes the state after
    position 3 from block 1 and leaves its own, after position 6, in block 3. The null block is 0."""
    step = live.StatePass(request_id, 2, 2, position, tokens, {})
    return replace(step, blocks={index: table[index] for index, _ in step.places if index < len(table)})


def state_reads(passes: list[live.StatePass], checker: Any = live) -> Seen:
    return {(f.check, f.request_id, f.block_id) for f in checker.state_findings(passes, 0)}


def state_caught_all(checker: Any) -> bool:
    """`checker` finds each broken pass below: the resumed state's block null, the block left
    null, the table short of it."""
    good = state_pass((0, 5, 0, 7), "a")
    return (
        state_reads([good, state_pass((0, 0, 0, 7), "b")], checker) == {("state_read", "b", 0)}
        and state_reads([good, state_pass((0, 5, 0, 0), "b")], checker) == {("state_read", "b", 0)}
        and state_reads([good, state_pass((0, 5, 0), "b")], checker) == {("state_read", "b", None)}
    )


def test_a_recurrent_pass_resumes_and_leaves_its_state_in_real_blocks() -> None:
    """Align mode keeps a state per block: the blocks between the one resumed and the one left
    may be null (their states were never kept), and a first pass resumes nothing."""
    assert state_pass((0, 5, 0, 7)).places[0][0] == 1 and state_pass((0, 5, 0, 7)).places[1][0] == 3
    assert state_reads([state_pass((0, 5, 0, 7))]) == set()
    assert state_reads([state_pass((0, 0, 0, 7), position=0, tokens=7)]) == set()
    assert state_reads([state_pass((0, 0, 0, 0), position=0, tokens=7)]) == {("state_read", "a", 0)}
    assert state_caught_all(live)


STATE_WEAKENED = [
    ("    for step in passes:\n        for index, what", "    for step in list(passes)[:-1]:\n        for index, what"),
    ("        for index, what in step.places:", "        for index, what in step.places[:-1]:"),
    ("if block is None or block == null_block:", "if block == null_block:"),
]


@pytest.mark.parametrize("change", STATE_WEAKENED, ids=[f"state-weakened-{n}" for n in range(len(STATE_WEAKENED))])
def test_the_state_check_weakened_at_an_edge_misses_one(
    change: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert state_caught_all(live)
    assert not state_caught_all(weakened(live, *change, monkeypatch))


def test_the_ghosts_of_evicted_keys_are_forgotten_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "GHOSTS_KEPT", 2)  # pruned past 2 + twice the map's 3 pairs
    checker = LiveChecker()
    checker.ghosts.update({f"old-{n}".encode(): ((n,), None, None) for n in range(9)})  # past 2 + 2 * 3 pairs
    assert found(view(), checker) == set()
    assert set(checker.ghosts) <= {A0, A1, X}  # the map's keys only
    assert A0 in checker.ghosts and A1 in checker.ghosts  # the cached blocks' own, seen again


def caught_all(checker: type[LiveChecker]) -> bool:
    """`checker` gives every expected finding above."""
    return (
        all(expected in found(broken(), checker()) for broken, expected in BROKEN.values())
        and ("ghost_content", "b", 1) in ghost_changed(checker)
        and ("finished_leftover", "b", 1) in finished_holds(checker)
        and stored_then_freed_to_front_with(checker) == set()
    )


def stored_then_freed_to_front_with(checker: type[LiveChecker]) -> Seen:
    """As `stored_then_freed_to_front`, with `checker`."""
    seen = checker()
    seen.check(storing_last())
    return found(view(free_queue=(6, 5)), seen)


# Checkers weakened at an edge: each loop stops one short (the last request, block, queue entry).
WEAKENED = [
    (
        "    for held in view.held:\n        for block in held.blocks:",
        "    for held in view.held[:-1]:\n        for block in held.blocks:",
    ),
    (
        "    for block in view.free_queue:\n        if block in seen:",
        "    for block in view.free_queue[:-1]:\n        if block in seen:",
    ),
    ("    for block, key in enumerate(view.keys):", "    for block, key in enumerate(view.keys[:-1]):"),
    ("        for held in view.held:\n            known =", "        for held in view.held[:-1]:\n            known ="),
    ("range(first, len(keys))", "range(first, len(keys) - 1)"),
    (
        "            for held in view.held\n            if held.request_id",
        "            for held in view.held[:-1]\n            if held.request_id",
    ),
    (
        "            for block, count in enumerate(view.ref_counts)\n            if count == 0",
        "            for block, count in enumerate(view.ref_counts[:-1])\n            if count == 0",
    ),
    ("    if counts == list(view.ref_counts):", "    if counts[:-1] == list(view.ref_counts)[:-1]:"),
    ("    for block, pins in view.pinned.items():", "    for block, pins in list(view.pinned.items())[:-1]:"),
    ("        for block in view.writing\n", "        for block in list(view.writing)[:-1]\n"),
    ("        for block in view.storing:", "        for block in list(view.storing)[:-1]:"),
    ("range(held.cached, len(held.blocks))", "range(held.cached, len(held.blocks) - 1)"),
]


@pytest.mark.parametrize("change", WEAKENED, ids=[f"weakened-{index}" for index in range(len(WEAKENED))])
def test_a_checker_weakened_at_an_edge_misses_one(change: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert caught_all(LiveChecker)
    assert not caught_all(weakened(live, *change, monkeypatch).LiveChecker)


def test_the_pools_events_must_count_the_blocks_its_map_names() -> None:
    """Folded, the events count each key's blocks; a block stored again after its removal (vLLM
    #49125's shape), a removal never stored, and the last event lost are each a finding."""
    cached: Counter[Entry] = Counter({(A0, DEVICE): 2, (A1, DEVICE): 1})  # A0 on two blocks, as vLLM may
    stored: list[KvEvent] = [Stored(A0, None, 2), Stored(A0, None, 2), Stored(A1, A0, 2)]
    assert LiveChecker().events(stored, cached) == []
    evicted: Counter[Entry] = Counter({(A0, DEVICE): 2})  # A1's block evicted
    cases: list[tuple[list[KvEvent], Counter[Entry]]] = [
        ([*stored, Removed(A1), Stored(A1, None, 2)], evicted),  # after its removal, stored again
        ([Removed(B1), *stored], cached),  # a removal no event stored
        (stored[:-1], cached),  # the last event lost
    ]
    for events, named in cases:
        findings = LiveChecker().events(events, named)
        assert [finding.check for finding in findings] == ["kv_events"], events
    assert LiveChecker().events([*stored, Removed(A1)], evicted) == []  # the eviction itself is fine
    checker = LiveChecker()
    checker.events(stored, cached)
    assert checker.events([Cleared()], Counter()) == []  # a reset: nothing named


def test_the_event_watch_reads_what_the_scheduler_took_in_between() -> None:
    pool = types.SimpleNamespace(kv_event_queue=["e1"])
    watch = EventWatch()
    assert watch.new(pool) == ["e1"]
    pool.kv_event_queue.append("e2")
    taken, pool.kv_event_queue = pool.kv_event_queue, ["e3"]  # vLLM's take_events
    assert taken == ["e1", "e2"] and watch.new(pool) == ["e2", "e3"]
    assert watch.new(pool) == []
