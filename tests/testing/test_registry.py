"""The registry is the one list of what kvsched checks: every event of every component, and for
every harness either that it drives the event or why it does not.

What each harness drives is read from the harness itself (the names its source builds events
from, the entries a registered component's machine and explorer draw, the z3 transitions that
exist), never from the registry; the test prints the event-by-harness matrix and fails on a cell
that is neither driven nor explained, and on an explanation of a cell that is driven.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from kvsched.spec import events as ev
from kvsched.spec import reserve_events as rev
from kvsched.testing.component import Component, EventSpec, Harness
from kvsched.testing.registry import COMPONENTS, MANAGER, component_of

ROOT = Path(__file__).resolve().parents[2]

# The sources of the harnesses that build events by hand, per component.
SOURCES: dict[tuple[str, Harness], tuple[str, ...]] = {
    ("system", Harness.MACHINE): (
        "kvsched/testing/machine.py",
        "kvsched/testing/harness.py",
        "kvsched/testing/rules_requests.py",
        "kvsched/testing/rules_owners.py",
        "kvsched/testing/rules_engine.py",
    ),
    ("system", Harness.EXPLORER): ("proofs/operations.py", "proofs/explorer.py"),
    ("engine", Harness.MACHINE): ("kvsched/testing/engine_machine.py",),
    ("engine", Harness.EXPLORER): ("proofs/engine_explorer.py",),
    ("manager", Harness.SAFETY): ("kvsched/testing/safety.py",),
}
CONTRACT_SOURCES = tuple(sorted(str(path.relative_to(ROOT)) for path in (ROOT / "kvsched/contracts").glob("*.py")))


def names_in(paths: tuple[str, ...]) -> set[str]:
    """Every name and attribute a set of source files refers to."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.Name):
                found.add(node.id)
    return found


def z3_models(entry: EventSpec) -> bool:
    """The entry names z3 transitions and each exists (`conformance:Event`: the system encoding
    has a branch for it)."""
    if not entry.z3:
        return False
    for model in entry.z3:
        module_name, name = model.split(":")
        if module_name == "conformance":
            if name != entry.name or name not in names_in(("proofs/conformance.py",)):
                return False
        else:
            module = importlib.import_module(f"kvsched.proofs.{module_name}")
            if name not in module.transitions():
                return False
    return True


def drives(component: Component, entry: EventSpec, harness: Harness) -> bool:
    """Whether `harness` really drives `entry`'s event."""
    if harness is Harness.Z3:
        return z3_models(entry)
    if harness is Harness.CONTRACTS:
        return entry.name in names_in(CONTRACT_SOURCES)
    sources = SOURCES.get((component.name, harness))
    if harness is Harness.SAFETY and sources is None:
        return False  # safety mode drives a manager's adapter, not these objects
    if sources is not None:
        return entry.name in names_in(sources)
    return (entry.draw if harness is Harness.MACHINE else entry.explore) is not None


CELLS = [(c, e, h) for c in COMPONENTS for e in c.events for h in Harness]


def test_every_event_is_registered_once() -> None:
    registered = [entry.event for component in COMPONENTS for entry in component.events]
    assert len(registered) == len(set(registered))
    assert set(registered) == set(ev.EVENTS) | set(rev.RESERVE_EVENTS) | set(MANAGER.event_types())
    assert all(component_of(object.__new__(event_type)) for event_type in registered)


def test_the_matrix_has_no_unexplained_gap(capsys: pytest.CaptureFixture[str]) -> None:
    problems: list[str] = []
    lines = [f"{'component':10} {'event':22} " + " ".join(f"{h.value:9}" for h in Harness)]
    for component in COMPONENTS:
        for entry in component.events:
            marks = []
            for harness in Harness:
                driven, why = drives(component, entry, harness), component.gap(entry, harness)
                if driven and entry.gaps.get(harness):
                    problems.append(f"{entry.name} under {harness.value}: driven, yet explained as a gap")
                if not driven and why is None:
                    problems.append(f"{entry.name} under {harness.value}: neither driven nor explained")
                marks.append("yes" if driven else "-")
            lines.append(f"{component.name:10} {entry.name:22} " + " ".join(f"{m:9}" for m in marks))
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert not problems, "\n".join(problems)


def test_a_new_unexplained_gap_fails() -> None:
    """The check has teeth: an event no harness drives, with no explanation, is a problem."""

    class Orphan:
        pass

    orphan = EventSpec(Orphan)
    component = COMPONENTS[0]
    missing = [h for h in Harness if not drives(component, orphan, h) and not orphan.gaps.get(h)]
    assert Harness.MACHINE in missing and Harness.EXPLORER in missing and Harness.Z3 in missing
