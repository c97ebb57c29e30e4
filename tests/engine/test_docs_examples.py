"""The engine page's embedding examples run as written."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "engine.md"


def test_the_embedding_example_runs() -> None:
    readme = PAGE.read_text()
    start = readme.index("## Embedding the engine")
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block[: block.index("```")], "docs/engine.md", "exec"), {})
    assert printed.getvalue().count("MAX_LENGTH after 20 tokens") == 3


def test_the_prefix_caching_example_runs() -> None:
    readme = PAGE.read_text()
    start = readme.index("## Automatic prefix caching")
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    exec(compile(block[: block.index("```")], "docs/engine.md", "exec"), {})
