"""`python -m kvsched.proofs`: exit status, summary rows for `kvsched verify`, the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.proofs import manifest
from kvsched.proofs import runner as entry
from kvsched.proofs.operations import Bounds
from kvsched.proofs.subject import SPEC, variant

TINY = Bounds(requests=1, pages=2, logical_pages=1, entries=1, entry_pages=1)


def test_the_inductive_half_passes_and_is_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "MANIFEST.json"
    assert entry.main(["--only", "inductive", "--manifest", str(path)]) == 0
    runs = json.loads(path.read_text())["runs"]
    assert [run["name"] for run in runs] == ["z3 inductive proofs"]
    assert runs[0]["outcome"] == "pass" and runs[0]["goals"] > 200
    assert "ensure_writable" in runs[0]["transitions"]
    out = capsys.readouterr()
    assert "z3 inductive proofs (every size)" in out.out
    assert "ensure_writable" in out.out and " ms" in out.out  # the per-transition proof times


def test_an_exploration_is_recorded_with_its_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "CI", (entry.Run(SPEC, TINY),))
    path = tmp_path / "MANIFEST.json"
    assert entry.main(["--only", "explore", "--manifest", str(path)]) == 0
    assert entry.main(["--only", "explore", "--manifest", str(path)]) == 0  # replaces, not appends
    (run,) = json.loads(path.read_text())["runs"]
    assert run["name"] == "explorer: spec R1 P2 L1 E1x1" and run["subject"] == "spec"
    assert run["bounds"]["requests"] == 1 and run["bounds"]["pages"] == 2
    assert run["states"] > 250 and run["transitions"] > run["states"]  # 277 classes since UNANSWERED outputs
    assert run["complete"] and run["outcome"] == "pass" and run["states_per_second"] > 0
    assert "inv_refcount_equals_owners" in run["invariants"]


def test_a_counterexample_fails_the_run_and_is_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(entry, "CI", (entry.Run(variant("finish leaks one page"), TINY),))
    assert entry.main(["--only", "explore", "--no-manifest"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "Finish(request_id=0)" in out


def test_summary_rows_have_the_verify_table_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "CI", (entry.Run(SPEC, TINY), entry.Run(SPEC, TINY, reference=SPEC)))
    rows = entry.summary_rows()
    assert len(rows) == 3
    assert all(len(row) == 6 and row[4] == "pass" for row in rows)
    assert str(rows[2][0]).startswith("explorer: spec ⇄ spec")


@pytest.mark.parametrize("profile", [entry.CI, entry.DEEP], ids=["ci", "deep"])
def test_the_profiles_reach_the_issue_sizes(profile: tuple[entry.Run, ...]) -> None:
    sizes = [(r.bounds.requests, r.bounds.pages, r.bounds.logical_pages, r.bounds.entries) for r in profile]
    assert any(r >= 3 and p >= 5 and lp >= 3 and e >= 2 for r, p, lp, e in sizes)
    assert any(r.bounds.max_depth is None for r in profile)  # and one closure of every reachable state
    assert any(r.subject.name == "impl" and r.reference is not None for r in profile)


def test_manifest_records_replace_by_name_and_profile(tmp_path: Path) -> None:
    path = tmp_path / "MANIFEST.json"
    manifest.record([{"name": "a", "profile": "ci", "n": 1}, {"name": "b", "profile": "ci", "n": 1}], path)
    manifest.record([{"name": "a", "profile": "ci", "n": 2}, {"name": "a", "profile": "deep", "n": 3}], path)
    assert [(r["name"], r["profile"], r["n"]) for r in manifest.load(path)] == [
        ("b", "ci", 1),
        ("a", "ci", 2),
        ("a", "deep", 3),
    ]


def test_ci_leaves_the_tracked_manifest_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tracked = tmp_path / "MANIFEST.json"
    monkeypatch.setattr(manifest, "MANIFEST", tracked)
    monkeypatch.setattr(entry, "CI", (entry.Run(SPEC, TINY),))
    monkeypatch.setenv("CI", "true")
    assert entry.main(["--only", "explore"]) == 0
    assert not tracked.exists()  # CI's checkout stays clean
    assert "not rewritten" in capsys.readouterr().err
    asked = tmp_path / "asked.json"
    assert entry.main(["--only", "explore", "--manifest", str(asked)]) == 0
    assert asked.exists() and not tracked.exists()
    monkeypatch.delenv("CI")
    assert entry.main(["--only", "explore"]) == 0
    assert [run["name"] for run in manifest.load(tracked)] == ["explorer: spec R1 P2 L1 E1x1"]


def test_the_manifest_path_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert entry.manifest_path(None, False) is None
    assert entry.manifest_path(tmp_path, False) == tmp_path
    assert entry.manifest_path(tmp_path, True) is None
    monkeypatch.setenv("CI", "false")
    assert entry.manifest_path(None, False) == manifest.MANIFEST


def test_a_whole_profile_replaces_its_earlier_runs(tmp_path: Path) -> None:
    path = tmp_path / "MANIFEST.json"
    manifest.record([{"name": "old", "profile": "ci"}, {"name": "kept", "profile": "deep"}], path)
    manifest.record([{"name": "new", "profile": "ci"}], path, whole="ci")
    assert [(r["name"], r["profile"]) for r in manifest.load(path)] == [("kept", "deep"), ("new", "ci")]
