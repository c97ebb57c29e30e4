"""`kvsched check`'s search reaches the host tier and leases of a manager someone else wrote: the
offload toy's planted tier, lease, salt and copy-on-write bugs are found at the defaults; kvsched's
own tiered parts are promoted into at their floor; a campaign that exercises a declared verb below
its floor warns, and `--strict` fails it. (Every seed 0-4 of every bug: `devtools.check_defaults`,
docs/benchmarks.md.)"""

from __future__ import annotations

from typing import Any

import pytest

from devtools import offload_toy
from kvsched.cli import main
from kvsched.testing import CheckFailed, FailureKind, SafetyMachine, safety_search, search_safety
from kvsched.testing.adapters import kvsched_parts
from kvsched.testing.safety import BadCapabilities
from tests.testing.test_check_command import replay


@pytest.mark.parametrize(
    ("fault", "seed", "kind"),
    [
        ("unsalted", 0, FailureKind.GHOST),
        ("host_keeps_old_key", 0, FailureKind.GHOST),
        ("free_drops_leases", 0, FailureKind.GHOST),
        ("loaded_unkeyed", 0, FailureKind.GHOST),
    ],  # cow_above_2, the copy-on-write toy's in_place in another manager: every seed on the benchmarks page
)
def test_the_offload_toys_planted_bugs_are_found_at_the_defaults(fault: str, seed: int, kind: FailureKind) -> None:
    result = search_safety(getattr(offload_toy, fault), seed_value=seed, source=("devtools.offload_toy", fault))
    assert result.failure is not None and result.failure.kind is kind, result.failure
    assert result.program is not None and replay(result.program) is kind


def test_the_correct_offload_toy_passes_and_its_tier_and_leases_are_exercised() -> None:
    result = search_safety(offload_toy.correct, examples=200, seed_value=1)
    assert result.passed, result.program
    assert result.coverage["promoted"] > 0 and result.coverage["leases_read"] > 0
    assert result.warnings == ()


def test_kvsched_parts_tiered_are_promoted_into_above_the_floor() -> None:
    examples = 100
    result = search_safety(kvsched_parts.tiered, examples=examples, seed_value=0)
    counter, per_thousand = safety_search.FLOORS["promote"]
    assert result.passed, result.program
    assert result.coverage[counter] >= per_thousand * examples // 1000
    assert result.warnings == ()


def test_a_verb_exercised_below_its_floor_warns_and_strict_fails_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    coverage: dict[str, Any] = {"promoted": 3, "demoted": 10**6}
    warnings = safety_search.coverage_warnings(offload_toy.correct(4, 2), coverage, examples=1000)
    assert any("'promote' was exercised 3 times (promoted), below its floor of 500" in w for w in warnings)
    assert not any("'demote'" in w for w in warnings)
    monkeypatch.setitem(safety_search.FLOORS, "promote", ("promoted", 10**9))
    assert main(["check", "devtools.offload_toy:correct", "--examples", "20"]) == 0
    assert main(["check", "devtools.offload_toy:correct", "--examples", "20", "--strict"]) == 1
    assert "below its floor" in capsys.readouterr().out


# -- copies in flight ("async_copies") ------------------------------------------------------------


@pytest.mark.parametrize(("fault", "seed"), [("store_unpinned", 0), ("failed_store_keyed", 0)])
def test_the_asynchronous_toys_planted_bugs_are_found_at_the_defaults(fault: str, seed: int) -> None:
    """Two of four; every one on seeds 0-4: the benchmarks page; each pinned in the safety corpus."""
    result = search_safety(getattr(offload_toy, fault), seed_value=seed, source=("devtools.offload_toy", fault))
    assert result.failure is not None and result.failure.kind is FailureKind.INVARIANT, result.failure
    assert result.program is not None and replay(result.program) is FailureKind.INVARIANT


def test_the_correct_asynchronous_toy_passes_with_copies_completed_and_failed_out_of_order() -> None:
    result = search_safety(offload_toy.asynchronous, examples=150, seed_value=0)
    assert result.passed, result.program
    assert result.coverage["promoted"] > 0 and result.coverage["demoted"] > 0


class InFlightUndeclared(offload_toy.OffloadAdapter):
    """Copies in flight from an adapter that does not declare "async_copies"."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size, asynchronous=True)
        self.capabilities = offload_toy.OffloadAdapter.capabilities


def test_copies_in_flight_need_the_capability() -> None:
    machine = SafetyMachine(InFlightUndeclared, pages=8)
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    with pytest.raises(CheckFailed, match="does not declare 'async_copies'"):
        machine.demote()


class AnswersNothing(offload_toy.OffloadAdapter):
    """A load's completion that does not say how many of its request's tokens are computed."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size, asynchronous=True)

    def complete(self, copy_id: int, ok: bool) -> int | None:
        super().complete(copy_id, ok)
        return None


def test_a_load_must_say_what_its_request_has_computed() -> None:
    machine = SafetyMachine(AnswersNothing, pages=8)
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    safety_search.land_every_copy(machine)
    machine.submit(3, (2,) * 16)
    machine.finish(3)
    machine.submit(5, (0, 0, 0, 0, 1))
    assert machine.loading == {5: 4}
    with pytest.raises(CheckFailed, match="it must say how many of the request's tokens are computed"):
        machine.complete_copy(min(machine.copies.flights if machine.copies else ()), True)


def test_the_protocol_of_copies_in_flight_is_refused_when_misused() -> None:
    machine = SafetyMachine(offload_toy.asynchronous, pages=8)
    with pytest.raises(ValueError, match="copy 9 is not in flight"):
        machine.complete_copy(9)
    with pytest.raises(ValueError, match="no async_copies capability"):
        SafetyMachine(offload_toy.correct, pages=8).complete_copy(1)

    class NoTier(offload_toy.OffloadAdapter):
        capabilities = frozenset({"async_copies", "atomic"})

    with pytest.raises(BadCapabilities, match="'async_copies' without 'demote' and 'promote'"):
        search_safety(NoTier)


class NeverLands(offload_toy.OffloadAdapter):
    """A completion that leaves the copy in flight."""

    def __init__(self, pages: int, page_size: int) -> None:
        super().__init__(pages, page_size, asynchronous=True)

    def complete(self, copy_id: int, ok: bool) -> int | None:
        return None


def stored_one_prompt(factory: Any) -> SafetyMachine:
    machine = SafetyMachine(factory, pages=8)
    machine.submit(1, (0, 0, 0, 0, 1))
    machine.finish(1)
    machine.demote()
    return machine


def test_a_copy_still_in_flight_after_it_completed_is_a_finding() -> None:
    machine = stored_one_prompt(NeverLands)
    with pytest.raises(
        CheckFailed, match=r"copy 1 \(page \d+ to host page \d+\) is still in flight after it completed"
    ):
        machine.complete_copy(1)


def test_teardown_ends_when_copies_never_leave_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Teardown completes copies a bounded number of times: a manager whose copies never end
    fails there instead of hanging (here every completion is skipped, so nothing ever ends)."""
    machine = stored_one_prompt(offload_toy.asynchronous)
    monkeypatch.setattr(machine, "_complete", lambda copy_id, ok: None)
    with pytest.raises(CheckFailed, match="copies stay in flight, or keep starting, while teardown completes them"):
        machine.teardown()
