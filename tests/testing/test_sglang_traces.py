"""SGLang's recorded answers to the harness (`make sglang` records them: devtools/sglang/record_traces.py),
replayed without SGLang: the stock radix caches pass, each broken variant fails with its check, and
each single-owner check fails when one recorded view is changed to break it."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.testing.adapters.recorded import RecordedError, TraceDiverged, replay
from kvsched.testing.checks import CheckFailure, FailureKind

GOLDEN = Path(__file__).parent / "golden" / "sglang"
STOCK = (
    "radix_token",
    "radix_paged",
    "unified_token",
    "unified_paged",
    "unified_rust_token",
    "unified_rust_paged",
    "pure_swa_prefill_aware",  # SGLang's all-SWA radix cache: one sliding-window group
    "hybrid_swa",  # SGLang's hybrid cache: a full and a sliding-window group, a pool each
    "hybrid_mamba",  # SGLang's hybrid cache: a full group and Mamba states in slots of their own
    "hybrid_swa_mamba",  # all three: full, sliding-window (its own pool) and Mamba
)
VARIANTS = {  # the check each broken variant must fail (devtools/sglang/variants.py)
    "duplicates_left_in_table": FailureKind.INVARIANT,
    "evicts_before_locking": FailureKind.INVARIANT,
    "dummy_page_handed_out": FailureKind.INVARIANT,
    "tenant_salt_dropped": FailureKind.GHOST,  # one tenant served another's KV
    "unified_evicts_before_locking": FailureKind.UNTYPED,  # SGLang raises KeyError: the node is gone
    "unified_rust_evicts_before_locking": FailureKind.UNTYPED,
    "unified_rust_dummy_page": FailureKind.INVARIANT,
    "unified_salt_dropped": FailureKind.GHOST,
    "window_slides_past_its_query": FailureKind.GHOST,  # the next query reads a slot the slide freed
    "pure_swa_caches_slid_slots": FailureKind.INVARIANT,  # SGLang's own: a release caches freed slots
    "hybrid_slides_past_its_query": FailureKind.GHOST,
    "tombstone_keeps_mapping": FailureKind.INVARIANT,  # a free SWA slot a row still maps (#27586's shape)
    "unlock_keeps_window_lock": FailureKind.LEAK,  # a window lock never released (#24153's class)
    "mamba_cow_skipped": FailureKind.GHOST,  # a hit resumes from a fresh state
    "swa_mamba_cow_skipped": FailureKind.GHOST,  # the same with a window group beside
    "mamba_cow_from_parent": FailureKind.GHOST,  # a hit resumes from a state short of its boundary
    "mamba_checkpoint_copy_leaked": FailureKind.LEAK,  # a checkpoint's copy the tree did not take (#29349's class)
    "mamba_state_kept_at_release": FailureKind.LEAK,  # a released state the tree did not take
}


def traces(name: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads(gzip.decompress((GOLDEN / f"{name}.json.gz").read_bytes()))
    return loaded


@pytest.mark.parametrize("name", STOCK)
def test_stock_traces_pass(name: str) -> None:
    recorded = traces(name)
    assert len(recorded) >= 40 and all(trace["verdict"] == "pass" for trace in recorded)
    assert all({"single_owner", "tenants"} <= set(trace["capabilities"]) for trace in recorded)
    for trace in recorded:
        assert replay(trace) is None


def test_the_stock_traces_exercise_hits_and_evictions() -> None:
    for name in STOCK:
        views = [call[2] for trace in traces(name) for call in trace["calls"] if call[0] == "view"]
        assert any(view["evictable"] for view in views), f"{name}: no view has an evictable page"
        hits = [call[2] for trace in traces(name) for call in trace["calls"] if call[0] == "admit" and call[2]]
        assert hits, f"{name}: no admission hit the tree"


def test_the_all_swa_traces_slide_their_windows() -> None:
    """The recorded all-SWA views show positions a window slide freed (the dummy page 0 in a group
    table, below a real page), and the traces declare the one window group."""
    recorded = traces("pure_swa_prefill_aware")
    assert all(trace["groups"] == [["Window", 4]] for trace in recorded)
    views = [call[2] for trace in recorded for call in trace["calls"] if call[0] == "view"]
    slid = [
        table for view in views for _, tables in view.get("group_tables", ()) for table in tables if 0 in table[:-1]
    ]
    assert slid and all(table[-1] != 0 for table in slid)


def test_the_hybrid_traces_keep_two_pools_and_tombstones() -> None:
    """The recorded hybrid views: every request has a full and a window table; a window table holds
    only SWA pool pages (past the reserved SWA dummy) and the null page 0, which some table shows
    below a real window page (a position slid out or a tombstone hit); the tree caches window KV
    under keys of its own, and some view caches a position's full KV without its window KV (a
    tombstone)."""
    recorded = traces("hybrid_swa")
    assert all(trace["groups"] == [["Full"], ["Window", 3]] for trace in recorded)
    slid = tombstones = 0
    for trace in recorded:
        for call in trace["calls"]:
            if call[0] != "view":
                continue
            view = call[2]
            swa_dummy = max(view["reserved"])
            for _, (full, window) in view.get("group_tables", ()):
                assert len(full) == len(window) and 0 not in full
                assert all(page == 0 or page > swa_dummy for page in window)
                slid += 0 in window[:-1] and window[-1] != 0
            keys = [key for _, key in view["cached"]]
            windowed = {(key[1], tuple(key[2])) for key in keys if key[0] == "swa"}
            full_keys = {(key[0], tuple(key[1])) for key in keys if key[0] != "swa"}
            tombstones += bool(full_keys - windowed)
    assert slid and tombstones


def test_the_mamba_traces_copy_states_both_ways() -> None:
    """The recorded Mamba views: every request has a full table and one state slot; the traces
    copy a hit's snapshot into a request's slot before its pass and a prefill's state into a
    snapshot after it, and their views hold snapshots keyed by salt and tokens."""
    recorded = traces("hybrid_mamba")
    assert all(trace["groups"] == [["Full"], ["Recurrent"]] for trace in recorded)
    assert all(trace["groups"] == [["Full"], ["Window", 3], ["Recurrent"]] for trace in traces("hybrid_swa_mamba"))
    copies = [call[2] for trace in recorded for call in trace["calls"] if call[0] == "state_copies"]
    assert any(before for before, _ in copies) and any(after for _, after in copies)
    views = [call[2] for trace in recorded for call in trace["calls"] if call[0] == "view"]
    assert all(len(slots) == 1 for view in views for _, slots in view["states"])
    snapshots = [key for view in views for _, key in view["snapshots"]]
    assert snapshots and all(len(key) == 2 and key[0].startswith("tenant-") for key in snapshots)


def test_a_snapshot_changed_under_its_key_fails() -> None:
    """One recorded view's last snapshot key moved onto its first snapshot's slot: the slot holds
    another state than the key was first seen over (`GHOST`)."""

    def move_the_last_snapshot(view: dict[str, Any]) -> bool:
        if len(view.get("snapshots", ())) < 2:
            return False
        (first, _), (_, key) = view["snapshots"][0], view["snapshots"][-1]
        view["snapshots"][-1] = [first, key]  # the last key now names the first slot's state
        view["snapshots"] = view["snapshots"][1:]
        return True

    failure = broken_view(move_the_last_snapshot, "hybrid_mamba")
    assert failure.kind is FailureKind.GHOST and "snapshot under key" in failure.detail


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_broken_variants_fail_with_their_check(name: str) -> None:
    (trace,) = traces(name)
    failure = replay(trace)
    assert failure is not None and failure.kind is VARIANTS[name] and failure.kind.name == trace["verdict"]
    if failure.kind is FailureKind.UNTYPED:  # what SGLang raised, replayed
        assert f"{RecordedError.__name__}: KeyError" in failure.detail


def test_a_replay_refuses_a_call_its_trace_does_not_hold() -> None:
    trace = copy.deepcopy(traces("radix_paged")[0])
    first_admit = next(index for index, call in enumerate(trace["calls"]) if call[0] == "admit")
    trace["calls"][first_admit][1][1] = [9, 9, 9]  # other tokens than the program's
    failure = replay(trace)  # the harness reports what its manager raised: a replay that diverged
    assert failure is not None and failure.kind is FailureKind.UNTYPED and TraceDiverged.__name__ in failure.detail


def broken_view(change: Any, name: str = "radix_paged") -> CheckFailure:
    """The first stock trace in which `change(view)` alters a recorded view (returning True),
    replayed with that one view changed: the check it fails."""
    for trace in traces(name):
        trace = copy.deepcopy(trace)
        for call in trace["calls"]:
            if call[0] == "view" and change(call[2]):
                failure = replay(trace)
                assert failure is not None, "the changed view passed"
                return failure
    raise AssertionError("no recorded view could be changed that way")


def test_a_page_with_no_owner_fails() -> None:
    def lose_the_last_free_page(view: dict[str, Any]) -> bool:
        if not view["free"]:
            return False
        view["free"].remove(max(view["free"]))  # the last page: an edge a weakened check skips
        return True

    failure = broken_view(lose_the_last_free_page)
    assert failure.kind is FailureKind.INVARIANT and "no owner has it" in failure.detail


def test_a_free_page_still_cached_fails() -> None:
    def free_the_last_cached_page(view: dict[str, Any]) -> bool:
        unheld = [page for page, _ in view["cached"] if page in view["evictable"]]
        if not unheld:
            return False
        page = max(unheld)
        view["evictable"].remove(page)
        view["free"].append(page)
        return True

    failure = broken_view(free_the_last_cached_page)
    assert failure.kind is FailureKind.INVARIANT and "free and still cached" in failure.detail


def test_a_private_page_in_two_tables_fails() -> None:
    def share_a_private_page(view: dict[str, Any]) -> bool:
        cached = {page for page, _ in view["cached"]}
        tables = view["tables"]
        if len(tables) < 2:
            return False
        (_, last_table), (_, other_table) = tables[-1], tables[0]
        private = [page for page in last_table if page not in cached and page not in other_table]
        if not private:
            return False
        other_table.append(private[-1])
        view["holders"][private[-1]] += 1  # counted, so only the owner check can object
        return True

    failure = broken_view(share_a_private_page)
    assert failure.kind is FailureKind.INVARIANT and "hold it as their own" in failure.detail


def test_an_evictable_page_a_request_holds_fails() -> None:
    def mark_a_held_tree_page_evictable(view: dict[str, Any]) -> bool:
        held = {page for _, table in view["tables"] for page in table}
        tree = [page for page, _ in view["cached"] if page in held and page not in view["evictable"]]
        if not tree:
            return False
        view["evictable"].append(max(tree))
        view["holders"][max(tree)] = 0
        return True

    failure = broken_view(mark_a_held_tree_page_evictable)
    assert failure.kind is FailureKind.INVARIANT and "evictable" in failure.detail


def test_evictable_pages_left_out_at_teardown_are_a_leak() -> None:
    for trace in traces("radix_paged"):
        final = trace["calls"][-1]
        if final[0] == "view" and final[2]["evictable"]:
            trace = copy.deepcopy(trace)
            trace["calls"][-1][2]["evictable"] = []
            failure = replay(trace)
            assert failure is not None and failure.kind is FailureKind.LEAK
            return
    raise AssertionError("no recorded teardown left an evictable page")
