"""nano-vllm's BlockManager (nano-vllm-fork, its block manager module alone) under safety mode:
its full-prefix-hit bug found and shrunk by `kvsched check`; its stale-hash bug (issue #163) on
upstream's `deallocate`, found at the defaults and pinned as the golden program; the fork's fix holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.testing import CheckFailed, FailureKind
from kvsched.testing.adapters import nanovllm

try:
    nanovllm._modules()
except ImportError:  # CI (make setup) installs it, so there a missing one fails
    if os.environ.get("CI"):
        raise
    pytest.skip("nano-vllm-fork is not installed: make setup installs it --no-deps", allow_module_level=True)

GOLDEN = Path(__file__).parent / "golden" / "nanovllm_issue_163.py"
SEARCH_SEED = "0"


def run_program(source: str, **replace: str) -> FailureKind | None:
    for old, new in replace.items():
        source = source.replace(old, new)
    try:
        exec(compile(source, "<counterexample>", "exec"), {})
    except CheckFailed as error:
        return error.failure.kind
    return None


def test_kvsched_check_finds_and_shrinks_the_full_prefix_hit(capsys: pytest.CaptureFixture[str]) -> None:
    """nano-vllm computes nothing for a prompt whose every page is cached (fix PR #199 unmerged)."""
    target = "kvsched.testing.adapters.nanovllm:manager"
    # shrinking is bounded by a count of programs, so the program never depends on speed
    status = main(["check", target, "--seed", "2", "--examples", "300", "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["outcome"] == "FAIL" and report["check"] == "FULL_HIT"
    assert report["program_steps"] <= 10
    assert run_program(report["program"]) is FailureKind.FULL_HIT  # the printed program fails as printed


def test_the_stale_hash_of_issue_163_serves_another_prefix_kv_on_upstream_logic() -> None:
    source = GOLDEN.read_text()
    assert run_program(source) is FailureKind.GHOST
    fixed = run_program(source, upstream_manager="manager")  # the fork's deallocate drops the hash
    assert fixed in (None, FailureKind.FULL_HIT)


@pytest.mark.proof  # a search until it catches the broken system: make proofs (CI) runs it
def test_kvsched_check_search_finds_the_stale_hash_of_issue_163(capsys: pytest.CaptureFixture[str]) -> None:
    """The pinned program is what this search prints, at the defaults (seed 0: about 8 s of CPU)."""
    target = "kvsched.testing.adapters.nanovllm:upstream_manager"
    status = main(["check", target, "--seed", SEARCH_SEED, "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["check"] == "GHOST"
    pinned = [line for line in GOLDEN.read_text().splitlines() if not line.startswith("# Found by")]
    assert report["program"].splitlines() == pinned


def test_the_documented_adapter_is_at_most_60_lines_and_finds_the_full_hit() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "checking-your-page-manager.md").read_text()
    start = page.index("## Example: nano-vllm's BlockManager")
    block = page[page.index("```python\n", start) + len("```python\n") :]
    block = block[: block.index("```")]
    assert len(block.splitlines()) <= 60
    namespace: dict[str, object] = {"_modules": nanovllm._modules}
    exec(compile(block, "checking-your-page-manager.md", "exec"), namespace)
    source = "from kvsched.testing import SafetyMachine\nmachine = SafetyMachine(manager)\n"
    source += "machine.submit(1, (0, 0))\nmachine.submit(2, (0, 0))\n"
    try:
        exec(source, namespace)
    except CheckFailed as error:
        assert error.failure.kind is FailureKind.FULL_HIT
    else:
        raise AssertionError("the documented adapter let a full prefix hit through")
