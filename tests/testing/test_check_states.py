"""`kvsched check` on recurrent state (a `Recurrent()` group): kvsched's own groups with a
recurrent group pass, resuming from snapshots; a state snapshotted with drafts pending (vLLM
#53912) is a GHOST read on the hit that resumes it, and the read check weakened at the last
recurrent group misses it; a copy into another request's state, a slot lost, a request's slot
free, and a snapshot key over two states each fail with their check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from kvsched.impl.kv_groups import KvGroups
from kvsched.testing import FailureKind, SafetyMachine, safety, safety_states, search_safety
from kvsched.testing.adapter import PoolView
from kvsched.testing.adapters import kvsched_groups
from kvsched.testing.adapters.kvsched_groups import KvschedGroups
from kvsched.testing.checks import CheckFailed
from kvsched.testing.components import manager
from tests.helpers import weakened


def test_kvscheds_groups_with_a_recurrent_group_pass_resuming_from_snapshots() -> None:
    result = search_safety(kvsched_groups.recurrent_manager, examples=200, seed_value=0)
    assert result.passed, result.program
    assert result.coverage["hit_pages"] > 0 and result.coverage["state_copies"] > 0
    assert result.coverage["drafted"] > result.coverage["rejected"] > 0
    assert result.warnings == ()


def run_snapshot_with_drafts(machine: SafetyMachine) -> None:
    """A decode with one draft the model rejects ends at a page boundary (two tokens on pages
    of two) with the draft pending; preempted and resumed, the request hits that boundary."""
    machine.submit(3, (0,))
    machine.speculate(3, 1, 0)
    machine.speculate(3, 1, 0)
    machine.preempt(3)
    machine.resume(3)


snapshot_off_its_boundary = kvsched_groups.broken("vllm_53912_snapshot_off_its_boundary")


def test_a_state_snapshotted_with_drafts_pending_is_a_ghost_read_on_its_hit() -> None:
    with pytest.raises(CheckFailed) as failed:
        run_snapshot_with_drafts(SafetyMachine(snapshot_off_its_boundary, pages=6, page_size=2))
    assert failed.value.failure.kind is FailureKind.GHOST
    assert "resumes group 2's state at position 2" in failed.value.failure.detail
    run_snapshot_with_drafts(SafetyMachine(kvsched_groups.recurrent_manager, pages=6, page_size=2))


def test_the_state_read_weakened_at_the_last_recurrent_group_misses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    every = "enumerate(self.recurrent):\n            slot"
    all_but_last = "enumerate(self.recurrent[:-1]):\n            slot"
    loose = weakened(safety_states, every, all_but_last, monkeypatch)
    monkeypatch.setattr(safety, "GhostStates", loose.GhostStates)
    run_snapshot_with_drafts(SafetyMachine(snapshot_off_its_boundary, pages=6, page_size=2))


class CopiesOverAnother(KvschedGroups):
    """An admission's state is also copied into request 1's state slot."""

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        found = super().admit(request_id, tokens)
        first = self.kv.requests.get(1)
        if found is not None and request_id != 1 and first is not None:
            own, theirs = self.kv.requests[request_id].states[2], first.states[2]
            assert own is not None and theirs is not None
            self.copied = (self.copied[0], [*self.copied[1], (own, theirs)])
        return found


class LosesASlot(KvschedGroups):
    """A freed request's state slot never goes back to the free slots."""

    def free(self, request_id: int) -> None:
        slots = self.kv.requests[request_id].states
        super().free(request_id)
        for slot in slots:
            if slot is not None:
                self.kv.free_slots.remove(slot)


class ShowsItsSlotFree(KvschedGroups):
    """The view shows the last live request's state slot among the free ones."""

    def view(self) -> PoolView:
        view = super().view()
        last = max(view.states, default=None)
        return view if last is None else replace(view, state_free=view.state_free | set(view.states[last]))


class OneKeyForEverySnapshot(KvschedGroups):
    """Every snapshot is shown under the same key, whatever state it holds."""

    def view(self) -> PoolView:
        view = super().view()
        return replace(view, snapshots=dict.fromkeys(view.snapshots, "one key"))


def test_a_state_copy_into_another_requests_slot_is_exclusive() -> None:
    machine = SafetyMachine(lambda pages, size: CopiesOverAnother(pages, size, recurrent=True), pages=16)
    assert machine.submit(1, (0, 1, 2))
    with pytest.raises(CheckFailed) as failed:
        machine.submit(2, (4, 5, 6))
    assert failed.value.failure.kind is FailureKind.EXCLUSIVE
    assert "which is request 1's state" in failed.value.failure.detail


def test_a_state_slot_lost_is_a_leak() -> None:
    machine = SafetyMachine(lambda pages, size: LosesASlot(pages, size, recurrent=True))
    machine.submit(1, (0, 1, 2))
    machine.finish(1)
    with pytest.raises(CheckFailed) as failed:
        machine.teardown()
    assert failed.value.failure.kind is FailureKind.LEAK
    assert "neither free nor a snapshot" in failed.value.failure.detail


def run_two_requests(factory: type[KvschedGroups]) -> None:
    machine = SafetyMachine(lambda pages, size: factory(pages, size, recurrent=True), pages=16, check=False)
    assert machine.submit(1, (0, 1, 2)) and machine.submit(2, (3, 4, 5))


def test_a_requests_state_slot_shown_free_is_an_invariant_failure() -> None:
    with pytest.raises(CheckFailed) as failed:
        run_two_requests(ShowsItsSlotFree)
    assert failed.value.failure.kind is FailureKind.INVARIANT
    assert "another owner may write it" in failed.value.failure.detail
    run_two_requests(KvschedGroups)


def test_the_state_invariant_weakened_at_the_last_request_misses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    every, all_but_last = "sorted(view.states.items()):", "sorted(view.states.items())[:-1]:"
    loose = weakened(safety_states, every, all_but_last, monkeypatch)
    monkeypatch.setattr(manager, "state_problems", loose.state_problems)
    run_two_requests(ShowsItsSlotFree)


def test_a_snapshot_key_over_two_states_is_a_ghost() -> None:
    machine = SafetyMachine(lambda pages, size: OneKeyForEverySnapshot(pages, size, recurrent=True), pages=16)
    assert machine.submit(1, (0, 1))  # its state after two tokens is snapshotted, a page boundary
    with pytest.raises(CheckFailed) as failed:
        machine.submit(2, (5, 6))
    assert failed.value.failure.kind is FailureKind.GHOST
    assert "first seen over the state after (2, 0, 1)" in failed.value.failure.detail


class NoPrefixCaching(KvschedGroups):
    """The groups with prefix caching off: no snapshot is ever taken, so no state is copied."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size, recurrent=True)
        self.kv = KvGroups(replace(self.kv.layout, prefix_caching=False))


def test_a_recurrent_group_whose_states_are_never_copied_is_warned_of() -> None:
    result = search_safety(NoPrefixCaching, examples=30, seed_value=0)
    assert result.passed and result.coverage["state_copies"] == 0
    assert any("never copied a state" in warning for warning in result.warnings), result.warnings


class LosesTheLastSlot(KvschedGroups):
    """The highest state slot is never on the free list: no request ever gets it, and none frees it."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size, recurrent=True)
        self.kv.free_slots.remove(len(self.kv.slots) - 1)


def test_the_last_slot_lost_is_a_leak_and_the_leak_check_weakened_there_misses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = SafetyMachine(LosesTheLastSlot)
    with pytest.raises(CheckFailed) as failed:
        machine.teardown()
    assert failed.value.failure.kind is FailureKind.LEAK and "state slots [7]" in failed.value.failure.detail
    every, all_but_last = "set(range(view.state_slots))", "set(range(view.state_slots - 1))"
    loose = weakened(safety_states, every, all_but_last, monkeypatch)
    monkeypatch.setattr(safety, "GhostStates", loose.GhostStates)
    SafetyMachine(LosesTheLastSlot).teardown()


class PagesInItsStateGroup(KvschedGroups):
    """The view shows the full group's pages in the recurrent group's table too."""

    def view(self) -> PoolView:
        view = super().view()
        tables = {rid: (*tables[:2], tables[0]) for rid, tables in view.group_tables.items()}
        return replace(view, group_tables=tables)


def test_pages_in_a_recurrent_groups_table_are_an_invariant_failure() -> None:
    machine = SafetyMachine(lambda pages, size: PagesInItsStateGroup(pages, size, recurrent=True), check=False)
    with pytest.raises(CheckFailed) as failed:
        machine.submit(1, (0, 1, 2))
    assert failed.value.failure.kind is FailureKind.INVARIANT
    assert "in recurrent group 2, which has no table" in failed.value.failure.detail
