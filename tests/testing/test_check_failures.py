"""`kvsched check --failures DIR`: a counterexample found once is stored, and every later run
replays the stored findings of its target first; a stored file is data, never code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import cow_toy
from kvsched.cli import main
from kvsched.testing import FailureKind
from kvsched.testing.failures import BadFinding, FailureStore, Finding, parse_call, replay, replay_all

TARGET = "devtools.cow_toy:in_place"  # copy-on-write that writes the shared page in place
FOUND = ("machine.submit(1, (0,))", "machine.fork(1, 2)", "machine.decode(1)")  # fails at its last call


def finding(target: str = TARGET, calls: tuple[str, ...] = FOUND, page_size: int = 2) -> Finding:
    return Finding(target, 4, page_size, calls, "EXCLUSIVE", "request 1 writes a page request 2 holds")


def test_a_counterexample_is_stored_and_replayed_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "failures"
    assert main(["check", TARGET, "--examples", "300", "--failures", str(store), "--json", "-"]) == 1
    searched = json.loads(capsys.readouterr().out)
    (stored,) = store.glob("*.json")
    kept = json.loads(stored.read_text())
    assert kept["target"] == TARGET and kept["check"] == searched["check"] == "EXCLUSIVE"
    assert "\n".join(kept["calls"]) in searched["program"]
    # a later run with another seed replays it before any search: one program, the same one
    assert main(["check", TARGET, "--seed", "7", "--failures", str(store), "--json", "-"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["replayed"] == str(stored) and replayed["programs"] == 1
    assert replayed["check"] == "EXCLUSIVE" and replayed["program"].endswith("\n".join(kept["calls"]) + "\n")
    assert list(store.glob("*.json")) == [stored]  # stored once


def test_the_replay_runs_every_call_to_the_last() -> None:
    failure = replay(cow_toy.in_place, finding())
    assert failure is not None and failure.kind is FailureKind.EXCLUSIVE
    assert replay(cow_toy.in_place, finding(calls=FOUND[:-1])) is None  # the last call is the bug


def test_the_first_finding_that_still_fails_is_reported_the_last_one_included() -> None:
    fixed, failing = finding(calls=FOUND[:-1]), finding()
    found, replayed = replay_all(cow_toy.in_place, [(Path("a.json"), fixed), (Path("b.json"), failing)])
    assert found is not None and found[0] == Path("b.json") and replayed == 2
    assert replay_all(cow_toy.in_place, [(Path("a.json"), fixed)]) == (None, 1)


def test_a_fixed_manager_replays_its_findings_then_searches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    FailureStore(tmp_path).add(finding(target="devtools.cow_toy:correct"))
    assert main(["check", "devtools.cow_toy:correct", "--examples", "50", "--failures", str(tmp_path)]) == 0
    assert "1 stored findings replayed" in capsys.readouterr().err


def test_only_the_target_s_findings_at_its_page_size_are_replayed(tmp_path: Path) -> None:
    store = FailureStore(tmp_path)
    store.add(finding(target="devtools.cow_toy:release_first"))
    store.add(finding(page_size=4))
    assert store.findings(TARGET, 2) == []
    assert [found.page_size for _, found in store.findings(TARGET, 4)] == [4]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not a stored finding"),
        (json.dumps({"target": TARGET}), "not a stored finding"),
        (json.dumps({"target": TARGET, "pages": "4", "page_size": 2, "calls": [], "check": "", "detail": ""}), "pages"),
    ],
)
def test_a_file_that_is_not_a_finding_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    (tmp_path / "bad.json").write_text(content)
    assert main(["check", TARGET, "--failures", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "line",
    [
        "import os",
        "machine.submit(__import__('os').system('touch pwned'), (0,))",
        "machine._fail(1, 'x')",
        "other.submit(1, (0,))",
        "machine.submit(1, tokens=(0,))",
    ],
)
def test_a_stored_call_is_data_never_code(tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str) -> None:
    with pytest.raises(ValueError):
        parse_call(line)
    path = FailureStore(tmp_path).add(finding())
    data = json.loads(path.read_text())
    data["calls"] = [*FOUND[:-1], line]
    path.write_text(json.dumps(data))
    assert main(["check", TARGET, "--failures", str(tmp_path)]) == 2
    assert "not a stored finding" in capsys.readouterr().err
    assert not Path("pwned").exists() and not (tmp_path / "pwned").exists()


def test_a_store_that_cannot_be_a_directory_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for where in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(BadFinding):
            FailureStore(where)
        assert main(["check", TARGET, "--failures", str(where)]) == 2
    FailureStore(tmp_path / "new" / "store")  # made where it is not there yet
    assert (tmp_path / "new" / "store").is_dir()


def test_a_sharded_campaign_stores_its_merged_counterexample(tmp_path: Path) -> None:
    arguments = ["check", TARGET, "--examples", "200", "--workers", "2", "--failures", str(tmp_path)]
    assert main(arguments) == 1
    (stored,) = tmp_path.glob("*.json")
    assert json.loads(stored.read_text())["check"] == "EXCLUSIVE"
