"""docs/benchmarks.md is exactly what the bench reports in docs/bench/ give: a figure edited by
hand, or a report regenerated without the page, fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import benchmarks_page


def test_the_page_is_generated_from_the_reports() -> None:
    assert benchmarks_page.render() == benchmarks_page.PAGE.read_text(encoding="utf-8")
    assert benchmarks_page.main(["--check"]) == 0


def test_every_report_says_when_how_and_where_it_was_measured() -> None:
    for name, _ in benchmarks_page.SECTIONS:
        measured = json.loads((benchmarks_page.BENCH / name).read_text(encoding="utf-8"))["measured"]
        assert {"date", "command", "cpus", "load_1min"} <= set(measured), name


def test_an_edited_figure_is_stale(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    page = benchmarks_page.PAGE.read_text(encoding="utf-8")
    edited = tmp_path / "benchmarks.md"
    changed = page.replace("| `cow_toy:in_place` | 5 of 5 |", "| `cow_toy:in_place` | 4 of 5 |")
    assert changed != page  # the figure is on the page
    edited.write_text(changed, encoding="utf-8")
    monkeypatch.setattr(benchmarks_page, "PAGE", edited)
    assert benchmarks_page.main(["--check"]) == 1
