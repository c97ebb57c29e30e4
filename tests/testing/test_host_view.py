"""The host tier's view checks: every host page is free, keyed or written by a save in flight,
exactly one of the three, the last page of the tier included."""

from __future__ import annotations

import pytest

from kvsched.testing.adapter import PoolView
from kvsched.testing.components.manager import host_problems


def view(free: set[int], keyed: dict[int, object], pending: set[int], pages: int = 4) -> PoolView:
    return PoolView(
        holders=(0,),
        free=frozenset({0}),
        tables={},
        host=keyed,
        host_free=frozenset(free),
        host_pages=pages,
        host_pending=frozenset(pending),
    )


def test_a_page_a_save_writes_is_accounted_for() -> None:
    assert host_problems(view({0, 1}, {2: "k"}, {3})) == []


@pytest.mark.parametrize(
    ("free", "keyed", "pending", "problem"),
    [
        ({0, 1, 3}, {2: "k"}, {3}, "host page 3 is free while a save in flight writes it"),
        ({0, 1}, {2: "k", 3: "j"}, {3}, "host page 3 is keyed while a save in flight writes it"),
        ({0, 1}, {2: "k"}, set(), "host pages [3] are neither free nor hold a key"),
        ({0, 1}, {2: "k"}, {3, 4}, "host pages [4] are outside the tier's 4 pages"),
    ],
)
def test_a_page_counted_twice_or_not_at_all_is_a_problem(
    free: set[int], keyed: dict[int, object], pending: set[int], problem: str
) -> None:
    assert any(found.startswith(problem) for found in host_problems(view(free, keyed, pending))), problem
