"""devtools.peers_report: a figure is the median over the run's repetitions, and a run with two
lines for one repetition is refused."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.peers_report import pick


def line(rep: int, us: float, **fields: Any) -> dict[str, Any]:
    return {"peer": "nano-vllm", "workload": "W3", "R": 128, "rep": rep, "us_per_step": us, "name": "x"} | fields


def test_each_number_is_the_median_of_the_repetitions() -> None:
    lines = [line(1, 90.0), line(2, 150.0), line(3, 100.0), line(1, 5.0, R=256)]
    picked = pick(lines, "nano-vllm", "W3", R=128)
    assert picked is not None
    assert (picked["us_per_step"], picked["name"]) == (100.0, "x")


def test_no_line_is_none_and_two_in_one_repetition_are_refused() -> None:
    assert pick([line(1, 90.0)], "vllm", "W3") is None
    with pytest.raises(SystemExit):
        pick([line(1, 90.0), line(1, 91.0)], "nano-vllm", "W3")
