"""`kvsched check` as a CI job sees it: exit 0 pass, 1 a counterexample (or, with --strict, a
coverage warning), 2 anything that kept the check from running; the planted copy-on-write bugs
found at the defaults; coverage counted and unexercised verbs warned about; a failure stops the
campaign where it happened, and the printed program replays to the same check."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from devtools import cow_toy
from kvsched.cli import main
from kvsched.testing import CheckFailed, FailureKind, safety, search_safety
from kvsched.testing.components import manager
from kvsched.testing.safety import NotAnAdapter, SafetyMachine


def replay(program: str) -> FailureKind | None:
    try:
        exec(compile(program, "<counterexample>", "exec"), {})
    except CheckFailed as error:
        return error.failure.kind
    return None


def test_the_correct_copy_on_write_toy_passes_at_the_defaults() -> None:
    """The planted bugs below are the toy's only difference from this one."""
    assert search_safety(cow_toy.correct, seed_value=0).passed


@pytest.mark.parametrize(
    ("factory", "seed", "kind"),
    [("in_place", 0, FailureKind.EXCLUSIVE)],  # release_first: the atomicity test below
)
def test_the_planted_copy_on_write_bugs_are_found_at_the_defaults(factory: str, seed: int, kind: FailureKind) -> None:
    result = search_safety(getattr(cow_toy, factory), seed_value=seed, source=("devtools.cow_toy", factory))
    assert result.failure is not None and result.failure.kind is kind
    assert result.program is not None and replay(result.program) is kind


class DocsOnlyAdapter(cow_toy.CowAdapter):
    """An adapter written from the protocol's required verbs alone: its manager can fork, but
    the adapter declares nothing, so the harness never forks and never sees the copy-on-write."""

    capabilities = frozenset({"atomic"})


def docs_only_in_place(pages: int, page_size: int) -> DocsOnlyAdapter:
    return DocsOnlyAdapter(pages, page_size, "in_place")


def test_a_verb_the_manager_has_but_the_adapter_does_not_declare_is_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = "tests.testing.test_check_command:docs_only_in_place"
    assert main(["check", target, "--examples", "100", "--json", "-"]) == 0  # the bug is never exercised ...
    report = json.loads(capsys.readouterr().out)
    assert report["coverage"]["forked"] == 0
    assert any("'fork' is not declared" in warning for warning in report["warnings"])  # ... and it says so
    assert main(["check", target, "--examples", "100", "--strict"]) == 1
    assert "warning: " in capsys.readouterr().out


def test_a_declared_capability_never_exercised_is_a_warning() -> None:
    class NeverForks(cow_toy.CowAdapter):
        def fork(self, parent_id: int, child_id: int) -> bool:
            return False

    result = search_safety(lambda pages, size: NeverForks(pages, size), examples=50)
    assert result.passed and result.coverage["forked"] == 0
    assert any("'fork' is declared but the campaign never exercised it" in w for w in result.warnings)
    assert any("'copy_on_write' is declared" in w for w in result.warnings)


def test_coverage_counts_what_the_campaign_exercised() -> None:
    result = search_safety(cow_toy.correct, examples=300)
    coverage = result.coverage
    assert set(coverage) >= {"admitted", "hit_pages", "appended", "forked", "copied", "refused", "freed"}
    assert coverage["admitted"] > 0 and coverage["forked"] > 0 and coverage["copied"] > 0 and coverage["freed"] > 0
    assert coverage["hit_pages"] == 0 and result.warnings == ()  # no cache, nothing declared unexercised


class CrashesOnSecond(cow_toy.CowAdapter):
    """A manager whose admit raises once a request is live; its teardown would leak as well."""

    def admit(self, request_id: int, tokens: Sequence[int]) -> int | None:
        if self.blocks.tables:
            raise KeyError("boom")
        return super().admit(request_id, tokens)

    def free(self, request_id: int) -> None:
        del self.blocks.tables[request_id]  # pages never come back: a leak at teardown


def crashes_on_second(pages: int, page_size: int) -> CrashesOnSecond:
    return CrashesOnSecond(pages, page_size)


def test_an_untyped_failure_stops_the_campaign_where_it_happened() -> None:
    machine = SafetyMachine(crashes_on_second)
    machine.submit(1, (0, 1))
    with pytest.raises(CheckFailed) as caught:
        machine.submit(2, (0, 1))
    assert caught.value.failure.kind is FailureKind.UNTYPED and machine.failed
    result = search_safety(
        crashes_on_second, examples=50, source=("tests.testing.test_check_command", "crashes_on_second")
    )
    assert result.failure is not None and result.failure.kind is FailureKind.UNTYPED
    assert result.program is not None and replay(result.program) is FailureKind.UNTYPED


REPLAYS = [
    ("devtools.broken_managers", "full_hit", FailureKind.FULL_HIT),
    ("devtools.broken_managers", "unwritten_hit", FailureKind.GHOST),
    ("devtools.broken_managers", "holder_count", FailureKind.INVARIANT),
    ("devtools.broken_managers", "refusal_allocates", FailureKind.ATOMICITY),
    ("devtools.broken_managers", "leak", FailureKind.LEAK),
    ("devtools.broken_managers", "reset_unpublished", FailureKind.EVENTS),
    ("devtools.cow_toy", "in_place", FailureKind.EXCLUSIVE),
    ("tests.testing.test_check_command", "crashes_on_second", FailureKind.UNTYPED),
]


@pytest.mark.parametrize(("module", "name", "kind"), REPLAYS, ids=[kind.name for _, _, kind in REPLAYS])
def test_the_printed_program_replays_to_the_same_check(module: str, name: str, kind: FailureKind) -> None:
    factory = getattr(importlib.import_module(module), name)
    result = search_safety(factory, examples=300, source=(module, name))
    assert result.failure is not None and result.failure.kind is kind
    assert result.program is not None and replay(result.program) is kind


def test_every_safety_check_has_a_replay_case() -> None:
    """Every kind the safety harness can raise (read from its source and its component's), so a
    new check needs a case."""
    source = inspect.getsource(safety) + inspect.getsource(manager)
    raised = {kind for kind in FailureKind if f"FailureKind.{kind.name}" in source}
    assert len(raised) >= 7 and {kind for _, _, kind in REPLAYS} == raised


raw_manager: Any = cow_toy.CowBlockManager  # the mistake under test: a manager, not an adapter


def test_a_raw_manager_is_refused_in_one_line_naming_the_missing_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NotAnAdapter, match="lacks admit, append, written, view, capabilities"):
        search_safety(raw_manager)
    assert main(["check", "devtools.cow_toy:CowBlockManager"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CowBlockManager is not a page-manager adapter" in err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["check", "devtools.cow_toy"], "expected MODULE:FACTORY"),
        (["check", "no_such_module_here:factory"], "cannot import no_such_module_here"),
        (["check", "devtools.cow_toy:nothing"], "has no nothing"),
        (["check", "devtools.cow_toy:__doc__"], "is not callable"),
        (["check", "devtools.cow_toy:CowBlockManager.free"], "factory(4, 2) raised AttributeError"),
        (["verify", "--variant", "no such variant", "--no-proofs"], "no variant 'no such variant'"),
    ],
)
def test_usage_and_import_errors_exit_2_with_one_line(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_missing_extra_exits_2_naming_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = __import__("importlib").import_module

    def without_hypothesis(name: str, package: str | None = None) -> object:  # as if hypothesis were missing
        if name == "kvsched.testing.check_command":
            raise ModuleNotFoundError("No module named 'hypothesis'", name="hypothesis")
        return real(name, package)

    monkeypatch.setattr("kvsched.cli.importlib.import_module", without_hypothesis)
    assert main(["check", "devtools.cow_toy:correct"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kvsched check needs hypothesis, from the 'testing' extra: pip install '.[testing]' in a kvsched checkout"
        " (or the wheel with [testing])"
    )


def test_the_current_directory_is_importable_as_python_m_makes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "toy_here.py").write_text("from devtools.cow_toy import correct\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # the checkout, for tests.*
    assert main(["check", "toy_here:correct", "--examples", "20"]) == 0
    assert "pass" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("kvsched ")


def test_an_atomicity_failure_says_what_changed_not_both_whole_views() -> None:
    """The planted release_first bug found at the defaults (seed 2; every seed: the benchmarks page)."""
    result = search_safety(cow_toy.release_first, seed_value=2, source=("devtools.cow_toy", "release_first"))
    assert result.failure is not None
    assert result.failure.detail == "a refused append changed the pool: page 3 holders 2 -> 1"
    assert result.program is not None and replay(result.program) is FailureKind.ATOMICITY


def test_shrinking_stops_after_its_count_of_programs() -> None:
    shrinking_from: list[int] = []

    def progress(programs: int, shrinking: bool) -> None:
        if shrinking and not shrinking_from:
            shrinking_from.append(programs)

    result = search_safety(cow_toy.release_first, seed_value=1, shrinks=50, progress=progress)
    assert result.failure is not None and shrinking_from
    # the budget, and the replay of the shrunk program; unbounded, this seed shrinks through about 4,600
    assert result.programs - shrinking_from[0] <= 50 + 2
