"""docs/checking-your-page-manager.md runs: every Python block, in order, in one namespace (the
blocks assert what the page says: the toy manager passes, the planted stale-hash bug is found by
the ghost check, and the printed counterexample fails when run)."""

from __future__ import annotations

import re
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "checking-your-page-manager.md"


def test_the_tutorial_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) >= 8  # each block asserts what the page says of it
    namespace: dict[str, object] = {"__name__": "toy"}
    for block in blocks:
        exec(compile(block, str(TUTORIAL), "exec"), namespace)
    assert namespace["UndeclaredFork"] is not None  # the last block ran
