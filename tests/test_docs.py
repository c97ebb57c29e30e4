"""The documentation site builds strictly, and the strict build fails on a broken link: the
check CI runs (`make docs`) can fail (it could not with `--quiet`, which hides the warnings that
`--strict` counts)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")

pytestmark = pytest.mark.skipif(
    not MKDOCS.exists() and not os.environ.get("CI"), reason="the docs extra is not installed"
)


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],  # as make docs: --quiet would hide the warnings
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def literal_markers(site: Path) -> list[str]:
    """The built pages that show a snippet marker as text (a marker the snippets extension did
    not read: `--8<--` mangled, for one, into `--8 < --`), read as text: tags dropped (code is
    highlighted token by token), entities decoded."""
    marker = re.compile(r"--8\s*<\s*--")
    return sorted(
        str(page.relative_to(site))
        for page in site.rglob("*.html")
        if marker.search(html.unescape(re.sub(r"<[^>]*>", "", page.read_text())))
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "Compute every prefill chunk of the step" in (tmp_path / "site" / "reference" / "index.html").read_text()
    assert literal_markers(tmp_path / "site") == []


def test_a_mangled_snippet_marker_is_found_in_the_built_site(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for package in ("kvsched", "spec", "impl", "kernels", "proofs", "devtools"):
        (copy / package).symlink_to(ROOT / package)
    page = copy / "docs" / "checking-your-page-manager.md"
    page.write_text(
        page.read_text().replace('--8<-- "devtools/cow_toy.py:adapter"', '--8 < --"devtools/cow_toy.py:adapter"')
    )
    done = build(copy, tmp_path / "site")
    assert done.returncode == 0, done.stderr  # the strict build alone does not see it
    assert literal_markers(tmp_path / "site") == ["checking-your-page-manager/index.html"]


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for package in ("kvsched", "spec", "impl", "kernels", "proofs", "devtools"):
        (copy / package).symlink_to(ROOT / package)
    page = copy / "docs" / "engine.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stderr
