"""The README: one page, its example runs, and the counterexample it shows is what `kvsched
check` prints for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvsched.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_is_one_page() -> None:
    assert len(README.read_text(encoding="utf-8")) <= 10_000


def test_the_engine_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    exec(compile(blocks[0], "README.md", "exec"), {})


def test_the_counterexample_shown_is_what_kvsched_check_prints(capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text(encoding="utf-8")
    shown = text[text.index("# exclusive write") :]
    shown = shown[: shown.index("```")].strip()
    assert main(["check", "devtools.cow_toy:in_place"]) == 1
    assert shown in capsys.readouterr().out


def test_every_linked_document_exists() -> None:
    for link in re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8")):
        assert (README.parent / link).is_file(), link
