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
from kvsched.testing import FailureKind, safety_search, search_safety
from kvsched.testing.adapters import kvsched_parts
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
