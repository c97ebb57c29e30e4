"""`kvsched check` on hybrid managers (capability "groups"): kvsched's own KV groups pass; each
upstream hybrid-KV bug the protocol can see is found at the defaults, its program replays; a
window page let go before the pass that reads it is a GHOST failure, and the read check weakened
at the window's first position misses it; the protocol refuses "groups" misused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvsched.cli import main
from kvsched.impl.kv_groups import KvGroups
from kvsched.spec.domain import require_int
from kvsched.spec.kv_groups import Read
from kvsched.spec.kv_layout import Full, Recurrent, first_kept
from kvsched.testing import FailureKind, SafetyMachine, safety, search_safety
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters import kvsched_groups
from kvsched.testing.adapters.kvsched_groups import FOUND, UNSEEN, KvschedGroups
from kvsched.testing.checks import CheckFailed
from kvsched.testing.components import manager
from kvsched.testing.group_variants import VARIANTS
from kvsched.testing.safety import BadCapabilities, NotAnAdapter
from tests.helpers import weakened
from tests.testing.test_check_command import replay

MODULE = "kvsched.testing.adapters.kvsched_groups"


def test_kvscheds_groups_pass_with_hits_drafts_and_evictions() -> None:
    result = search_safety(kvsched_groups.manager, examples=200, seed_value=0)
    assert result.passed, result.program
    assert result.coverage["hit_pages"] > 0 and result.coverage["evicted"] > 0 and result.coverage["refused"] > 0
    assert result.coverage["drafted"] > result.coverage["rejected"] > 0
    assert result.warnings == ()


class CachesItsDrafts(KvGroups):
    """The full pages a pass's drafts complete are cached as the pass ends, before the model
    says which it keeps: a rejected draft's KV cached under its tokens."""

    def _settle(self, held: Any) -> None:
        super()._settle(held)
        size, written = self.layout.page_size, held.tokens + held.drafts
        for g, table in enumerate(held.tables):
            for page in range(held.computed // size, (held.computed + len(held.drafts)) // size):
                key, physical = (g, written[: (page + 1) * size]), table[page]
                if key not in self.page_of and physical not in self.key_of:
                    self.page_of[key], self.key_of[physical] = physical, key
                    self.refs[physical] += 1


def caches_its_drafts(pages: int, page_size: int) -> KvschedGroups:
    return KvschedGroups(pages, page_size, CachesItsDrafts)


def test_a_rejected_drafts_kv_cached_is_found_at_the_defaults() -> None:
    result = search_safety(caches_its_drafts, seed_value=0, source=(__name__, "caches_its_drafts"))
    assert result.failure is not None and result.failure.kind is FailureKind.GHOST, result.failure
    assert "a key that outlives its content" in result.failure.detail


def test_every_variant_is_found_or_said_to_be_out_of_sight() -> None:
    assert set(FOUND) | set(UNSEEN) == set(VARIANTS) and not set(FOUND) & set(UNSEEN)


SLOW = {"vllm_50457_hit_from_the_first_full_group", "vllm_47926_drafter_left_out_of_the_hit"}  # ~17 s each


FOUND_BY = {
    "vllm_53912_snapshot_off_its_boundary": FailureKind.GHOST,
    # found by the tables' spans (below); shrinking then ends at the variant's own IndexError, three calls long
    "ucm_1059_truncation_touches_group_zero": FailureKind.UNTYPED,
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.proof] if n in SLOW else []) for n in FOUND])
def test_each_upstream_bug_the_protocol_sees_is_found_at_the_defaults(name: str) -> None:
    kind = FOUND_BY.get(name, FailureKind.INVARIANT)
    result = search_safety(getattr(kvsched_groups, name), seed_value=0, source=(MODULE, name))
    assert result.failure is not None and result.failure.kind is kind, result.failure
    assert result.program is not None and replay(result.program) is kind


UCM_1059 = (  # what the search finds first on seed 0 (`shrinks=0`): rejected drafts kept in the window group
    "machine.submit(2, (0,))",
    "machine.submit(3, (0, 0, 1, 1, 2))",
    "machine.speculate(2, 3, 1)",
    "machine.speculate(3, 3, 1)",
    "machine.decode(2)",
)


def test_a_truncation_of_group_zero_alone_is_found_by_the_tables_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """UCM PR #1059: the rejected drafts' pages let go in the first group only. The request's groups
    then span different numbers of pages; the check weakened to skip the last group misses it."""
    result = search_safety(kvsched_groups.ucm_1059_truncation_touches_group_zero, seed_value=0, shrinks=0)
    assert result.failure is not None and result.failure.kind is FailureKind.INVARIANT
    assert "span different numbers of pages" in result.failure.detail

    def pinned() -> CheckFailed | None:
        machine = SafetyMachine(kvsched_groups.ucm_1059_truncation_touches_group_zero, pages=16, page_size=2)
        try:
            for line in UCM_1059:
                exec(line, {"machine": machine})  # the pinned program's calls
        except CheckFailed as failed:
            return failed
        return None

    failed = pinned()
    assert failed is not None and "span different numbers of pages" in failed.failure.detail
    check = "for group, table in zip(state.groups, tables, strict=True) if not isinstance(group, Recurrent)"
    loose = weakened(
        manager, check, check.replace("zip(state.groups, tables", "zip(state.groups[:-1], tables[:-1]"), monkeypatch
    )
    monkeypatch.setattr(safety, "view_problems", loose.view_problems)  # read as a call begins ...
    monkeypatch.setattr(safety, "MANAGER", replace(manager.MANAGER, violations=loose.view_problems))  # ... and after it
    failed = pinned()
    assert failed is None or "span different numbers of pages" not in failed.failure.detail


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_a_bug_out_of_the_protocols_sight_passes_it(name: str) -> None:
    """What `UNSEEN` says is so: these differ from the spec only where the view does not look."""
    assert search_safety(getattr(kvsched_groups, name), examples=150, seed_value=0).passed


class ReleasedAfterItsPass(KvGroups):
    """The window's pages let go as each pass ends, behind the next query: the tables a call
    leaves miss the page the next pass reads at the window's first position."""

    def compute(self, request_id: object, count: object, drafts: object = ()) -> tuple[Read, ...]:
        reads = super().compute(request_id, count, drafts)
        held = self.requests[require_int("request id", request_id)]
        size = self.layout.page_size
        for g, group in enumerate(self.layout.groups):
            self._release_behind(held.tables[g], first_kept(group, held.computed, size))
        return reads


def released_after_its_pass(pages: int, page_size: int) -> KvschedGroups:
    return KvschedGroups(pages, page_size, ReleasedAfterItsPass)


def run_released_early(machine: SafetyMachine) -> None:
    """Four tokens on pages of two, a window of four: the decode at position 4 reads positions
    1-3, and position 1 is on the first page, which a pass over position 3 that lets go behind
    the next query has let go."""
    machine.submit(1, (0, 1, 2, 0))
    machine.decode(1)


def test_a_window_page_let_go_before_the_pass_that_reads_it_is_a_ghost() -> None:
    machine = SafetyMachine(released_after_its_pass, pages=16, page_size=2)
    with pytest.raises(CheckFailed) as failed:
        run_released_early(machine)
    assert failed.value.failure.kind is FailureKind.GHOST
    assert "reads position 1 of group 1" in failed.value.failure.detail
    run_released_early(SafetyMachine(kvsched_groups.manager, pages=16, page_size=2))  # the correct one reads it


def test_the_read_check_weakened_at_the_windows_first_position_misses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    first, later = "for position in range(first, stop):", "for position in range(first + 1, stop):"
    loose = weakened(safety, first, later, monkeypatch)
    run_released_early(loose.SafetyMachine(released_after_its_pass, pages=16, page_size=2))


def test_the_default_search_finds_the_early_release() -> None:
    result = search_safety(released_after_its_pass, seed_value=0, source=(__name__, "released_after_its_pass"))
    assert result.failure is not None and result.failure.kind is FailureKind.GHOST, result.failure


def test_kvsched_check_runs_a_hybrid_manager_and_exits_1_on_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", f"{MODULE}:manager", "--examples", "40"]) == 0
    assert main(["check", f"{MODULE}:sglang_38269_null_page_freed", "--examples", "200"]) == 1
    assert "reserved pages [0] are free" in capsys.readouterr().out


class Misdeclared(KvschedGroups):
    def __init__(self, pages: int, page_size: int, capabilities: frozenset[str], groups: Any) -> None:
        super().__init__(pages, page_size)
        self.capabilities = capabilities
        self.groups = groups
        # each declaration's verb is missing: accept for "drafts", state_copies for a Recurrent group
        if "drafts" in capabilities:
            self.accept = None  # type: ignore[method-assign,assignment]
        if isinstance(groups, tuple) and any(isinstance(group, Recurrent) for group in groups):
            self.state_copies = None  # type: ignore[method-assign,assignment]


@pytest.mark.parametrize(
    ("capabilities", "groups", "error", "says"),
    [
        ({"groups", "fork"}, (Full(),), BadCapabilities, "'groups' with ['fork']"),
        ({"groups"}, (), NotAnAdapter, "one of them an attention group"),
        ({"groups"}, [Full()], NotAnAdapter, "one of them an attention group"),
        ({"groups"}, (Recurrent(),), NotAnAdapter, "one of them an attention group"),
        ({"groups"}, (Full(), "window"), NotAnAdapter, "Full, Window, Chunked and Recurrent"),
        ({"groups", "drafts"}, (Full(),), NotAnAdapter, "lacks accept"),
        ({"groups"}, (Full(), Recurrent()), NotAnAdapter, "lacks state_copies"),
    ],
)
def test_groups_misdeclared_are_refused_before_anything_runs(
    capabilities: set[str], groups: Any, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says.replace("[", r"\[").replace("]", r"\]")):
        SafetyMachine(lambda pages, size: Misdeclared(pages, size, frozenset(capabilities), groups))


class WrongShape(KvschedGroups):
    def view(self) -> PoolView:
        view = super().view()
        return PoolView(view.holders, view.free, {}, reserved=view.reserved, group_tables={1: ((2,),)})


def test_a_group_table_missing_is_an_invariant_failure() -> None:
    machine = SafetyMachine(lambda pages, size: WrongShape(pages, size), check=False)
    with pytest.raises(CheckFailed) as failed:
        machine.submit(1, (0, 1))
    assert failed.value.failure.kind is FailureKind.INVARIANT
    assert "1 tables for 2 groups" in failed.value.failure.detail


def test_a_full_group_never_holds_the_null_page() -> None:
    class NullInFull(KvschedGroups):
        def view(self) -> PoolView:
            view = super().view()
            tables = {rid: ((0, *tables[0][1:]), tables[1]) for rid, tables in view.group_tables.items()}
            return PoolView(view.holders, view.free, {}, view.cached, view.reserved, group_tables=tables)

    with pytest.raises(CheckFailed) as failed:
        SafetyMachine(lambda pages, size: NullInFull(pages, size)).submit(1, (0, 1, 2))
    assert "holds page 0 in group 0, outside the pool" in failed.value.failure.detail
