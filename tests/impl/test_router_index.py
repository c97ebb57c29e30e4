"""The router's index: impl's in lockstep with the spec's (`kvsched.spec.router_index`) by its
registration, every verdict by hand, vLLM's encoding, and every broken index
(`kvsched.testing.index_variants`) caught by the check that reads the scripted engines' truth.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest

from kvsched.impl.router_index import RouterIndex as ImplRouterIndex
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec import index_events as iev
from kvsched.spec.errors import InvalidArgument
from kvsched.spec.kv_events import (
    DEVICE,
    HOST,
    Cleared,
    Entry,
    EventBatch,
    Key,
    Removed,
    Snapshot,
    Stored,
    changes,
    fold_events,
    from_vllm,
    to_vllm,
)
from kvsched.spec.router_index import RouterIndex, Verdict
from kvsched.spec.step import apply
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import check_step
from kvsched.testing.component_machine import machine_for
from kvsched.testing.components.router_index import IndexConfig, impl_index, spec_index
from kvsched.testing.index_variants import VARIANTS
from kvsched.testing.outcome import CheckFailed, CheckFailure, FailureKind, capture
from kvsched.testing.registry import ROUTER_INDEX

CONFIG = ROUTER_INDEX.explored["ci"][0]
CALLS: Counter[str] = Counter()


def run(index: Any, program: list[Any], reference: Any = None) -> CheckFailure | None:
    """Each event on `index` (and `reference`), every step checked; the first failure."""
    for event in program:
        before = index.to_spec()
        outcome = capture(functools.partial(apply, index, event))
        expected = None
        if reference is not None:
            expected = capture(functools.partial(apply, reference, event)), reference.to_spec()
        failure = check_step(before, event, outcome, index.to_spec(), expected, component=ROUTER_INDEX, config=CONFIG)
        if failure is not None:
            return failure
    return None


def deliver(engine: str, epoch: int, seq: int, source: str | None = None) -> iev.Deliver:
    return iev.Deliver(source or engine, CONFIG.batch(engine, epoch, seq))


PROGRAMS: dict[str, list[Any]] = {
    "llmd_2853_restart_keeps_blocks": [deliver("e0", 0, 0), deliver("e0", 1, 0)],
    "aibrix_2385_ignores_all_cleared": [deliver("e0", 0, 0), deliver("e0", 0, 1), deliver("e0", 0, 2)],
    # the view that goes wrong is the last engine's: a check that skipped it would pass
    "vllm_45174_folds_foreign_batches": [deliver("e0", 0, 0), deliver("e0", 0, 0, source="e1")],
    "llmd_kv_cache_593_folds_across_a_gap": [deliver("e1", 0, 0), deliver("e1", 0, 2)],
}


def test_impl_refines_the_spec() -> None:
    CALLS.clear()
    machine = machine_for(ROUTER_INDEX, impl_index, spec_index, IndexConfig(), tally=CALLS)
    machine.TestCase.settings = bounded(80, 30)
    machine.TestCase().runTest()
    assert CALLS["made"] > 1000 and CALLS["refused"] > 0  # good input and bad reached both


@pytest.mark.proof
def test_every_state_of_a_small_index_refines_the_spec() -> None:
    result = ComponentExplorer(ROUTER_INDEX, CONFIG, impl_index, spec_index).run()
    assert result.complete and result.violation is None, result.violation
    assert result.states == 225 and result.transitions == 13_500


def test_every_program_is_clean_on_the_spec_and_impl() -> None:
    """The pinned programs are fair: the correct indexes pass every one of them."""
    for program in PROGRAMS.values():
        assert run(ImplRouterIndex(), program, RouterIndex()) is None


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_upstream_bug_is_caught_by_its_check(name: str) -> None:
    failure = run(VARIANTS[name](), PROGRAMS[name])
    assert failure is not None and failure.kind is FailureKind.GHOST, failure
    assert "view" in failure.detail


def test_the_foreign_batch_is_caught_on_the_last_engine() -> None:
    failure = run(VARIANTS["vllm_45174_folds_foreign_batches"](), PROGRAMS["vllm_45174_folds_foreign_batches"])
    assert failure is not None and "e1's view" in failure.detail, failure


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_broken_index_is_told_apart_by_the_explorer(name: str) -> None:
    violation = ComponentExplorer(ROUTER_INDEX, CONFIG, lambda c: VARIANTS[name](), spec_index).run(20_000).violation
    assert violation is not None, name


def test_the_machine_finds_a_broken_index() -> None:
    machine = machine_for(ROUTER_INDEX, lambda c: VARIANTS["vllm_45174_folds_foreign_batches"](), None, IndexConfig())
    machine.TestCase.settings = bounded(1000, 30, shrink=False)
    with pytest.raises(CheckFailed):
        machine.TestCase().runTest()


@pytest.mark.parametrize("flavour", [RouterIndex, ImplRouterIndex])
def test_every_verdict_by_hand(flavour: Any) -> None:
    index = flavour()
    a, b = Stored("a", None, 4), Stored("b", "a", 4)
    assert index.fold("e0", EventBatch("e0", 0, 0, (a, b))) is Verdict.FOLDED
    assert index.longest_prefix("e0", ("a", "b", "c")) == 2
    assert index.fold("e0", EventBatch("e0", 0, 0, (a,))) is Verdict.DUPLICATE
    assert index.fold("e1", EventBatch("e0", 0, 1, ())) is Verdict.FOREIGN
    assert index.fold("e0", EventBatch("e0", 0, 1, (Removed("b"), Stored("a", None, 4, HOST)))) is Verdict.FOLDED
    assert index.route(("a", "b")) == ("e0", 1)
    before = index.to_spec()
    with pytest.raises(InvalidArgument):
        index.fold("e0", EventBatch("e0", 0, 2, (Removed("a", "disk"),)))
    assert index.to_spec() == before  # refused: nothing changed
    assert index.fold("e0", EventBatch("e0", 0, 2, (Removed("b"),))) is Verdict.CONTRADICTS
    assert index.longest_prefix("e0", ("a",)) == 0  # stale: serves nothing
    assert index.fold("e0", EventBatch("e0", 0, 3, ())) is Verdict.STALE
    snapshot = Snapshot("e0", 0, 4, (("a", DEVICE, None), ("a", HOST, None)))
    assert index.resync("e0", snapshot) is Verdict.RESYNCED
    assert index.resync("e0", Snapshot("e0", 0, 1, ())) is Verdict.LATE  # it expects seq 4 already
    assert index.fold("e0", EventBatch("e0", 0, 5, ())) is Verdict.GAP
    assert index.fold("e0", EventBatch("e0", 1, 0, (Stored("c", None, 4),))) is Verdict.RESTARTED
    assert index.longest_prefix("e0", ("a",)) == 0 and index.longest_prefix("e0", ("c",)) == 1
    assert index.fold("e0", EventBatch("e0", 0, 9, ())) is Verdict.LATE
    assert index.fold("e1", EventBatch("e1", 0, 4, ())) is Verdict.GAP  # first heard mid-stream
    assert index.route(("c",)) == ("e0", 1) and index.route(("q",)) == (None, 0)
    with pytest.raises(InvalidArgument):
        index.longest_prefix("e0", (["unhashable"],))


def test_changes_fold_to_the_cached_set() -> None:
    """The publisher's events take a consumer from what it had to what is cached."""
    published = frozenset({("a", DEVICE), ("b", DEVICE)})
    cached: dict[Entry, tuple[Key | None, int]] = {
        ("a", DEVICE): (None, 0),
        ("a", HOST): (None, 0),
        ("c", DEVICE): ("a", 1),
    }
    events = changes(published, cached, 4)
    assert events == (Removed("b"), Stored("a", None, 4, HOST), Stored("c", "a", 4, DEVICE))  # shallow first
    assert fold_events(published, events) == cached.keys()
    reset = changes(published, cached, 4, cleared=True)
    assert reset[0] == Cleared() and fold_events(published, reset) == cached.keys()


def test_vllms_encoding_maps_one_to_one() -> None:
    batch = EventBatch("e0", 2, 7, (Stored(b"k1", None, 16), Removed(b"k0", HOST), Cleared(), Stored(b"k2", b"k1", 16)))
    seq, events = to_vllm(batch, 16)
    assert seq == 7 and events[0] == ["BlockStored", [b"k1"], None, [], 16, None, "GPU", None]
    assert events[1] == ["BlockRemoved", [b"k0"], "CPU"] and events[2] == ["AllBlocksCleared"]
    assert from_vllm("e0", 2, seq, events) == batch
    chained = from_vllm("e0", 0, 0, [["BlockStored", [1, 2], None, [], 16, None, None, None]])
    assert chained.events == (Stored(1, None, 16), Stored(2, 1, 16))  # one event a hash, each child of the last
    for bad in (["BlockStored", 5], ["Nope"], "BlockRemoved"):
        with pytest.raises(InvalidArgument):
            from_vllm("e0", 0, 0, [bad])
