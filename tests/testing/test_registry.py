"""The registry is the one list of what kvsched checks: every event of every component, and for
every harness either that it drives the event or why it does not.

What each harness drives is read from the harness itself (`devtools.coverage_page.drives`: the
names its source builds events from, the entries a registered component's machine and explorer
draw, the z3 transitions that exist), never from the registry. The test prints the matrix
(`docs/coverage.md`, which must be current) and fails on a cell that is neither driven nor
explained, and on an explanation of a cell that is driven.
"""

from __future__ import annotations

import pytest

from devtools import coverage_page
from kvsched.spec import events as ev
from kvsched.spec import group_events as gev
from kvsched.spec import index_events as iev
from kvsched.spec import reserve_events as rev
from kvsched.spec import tier_events as tev
from kvsched.testing.component import EventSpec, Harness
from kvsched.testing.registry import COMPONENTS, MANAGER, component_of


def test_every_event_is_registered_once() -> None:
    registered = [entry.event for component in COMPONENTS for entry in component.events]
    assert len(registered) == len(set(registered))
    assert set(registered) == set(ev.EVENTS) | set(rev.RESERVE_EVENTS) | set(tev.TIER_EVENTS) | set(
        iev.INDEX_EVENTS
    ) | set(gev.GROUP_EVENTS) | set(MANAGER.event_types())
    assert all(component_of(object.__new__(event_type)) for event_type in registered)


def test_the_matrix_has_no_unexplained_gap(capsys: pytest.CaptureFixture[str]) -> None:
    page = coverage_page.render()
    with capsys.disabled():
        print("\n" + page)
    assert coverage_page.problems() == []
    assert "NOT EXPLAINED" not in page


def test_the_coverage_page_is_current() -> None:
    assert coverage_page.PAGE.read_text() == coverage_page.render(), "run python -m devtools.coverage_page"


def test_a_new_unexplained_gap_fails() -> None:
    """The check has teeth: an event no harness drives, with no explanation, is a problem."""

    class Orphan:
        pass

    orphan = EventSpec(Orphan)
    component = COMPONENTS[0]
    missing = [h for h in Harness if not coverage_page.drives(component, orphan, h) and not orphan.gaps.get(h)]
    assert Harness.MACHINE in missing and Harness.EXPLORER in missing and Harness.Z3 in missing


def test_an_explanation_of_a_driven_cell_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale reason is caught too: explain a gap the machine does not have."""
    system = COMPONENTS[0]
    admit = system.event_spec(ev.Admit(0))
    monkeypatch.setitem(admit.gaps, Harness.MACHINE, "stale")
    assert any("Admit under machine: driven" in problem for problem in coverage_page.problems())
