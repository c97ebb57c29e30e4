"""`kvsched bench --quick`: both systems replay the workload and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.impl.bench import main

OPERATIONS = {
    "admit",
    "ensure_writable",
    "record_token",
    "mark_prefill_complete + seed_decode_token",
    "round",
    "finish",
    "whole workload (spec rounds extrapolated)",
}


def test_quick_bench_times_spec_and_impl_on_every_operation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, chart = tmp_path / "bench.json", tmp_path / "rounds.svg"
    assert main(["--quick", "--json", str(path), "--plot", str(chart)]) == 0
    report = json.loads(path.read_text())
    rows = report["rows"]
    for requests in report["plan"]["requests"]:
        decode = {row["operation"]: row for row in rows if row["workload"] == "decode" and row["requests"] == requests}
        assert set(decode) == OPERATIONS
        for row in decode.values():
            assert row["spec_us"] > 0 and row["impl_us"] > 0
            assert row["speedup"] == pytest.approx(row["spec_us"] / row["impl_us"])
        assert decode["round"]["spec_calls"] == report["plan"]["spec_rounds"]
        assert decode["round"]["impl_calls"] == report["plan"]["rounds"]
    prefix = {row["operation"] for row in rows if row["workload"] == "shared prefix"}
    assert {"admit_with_prefix (hit)", "ensure_writable (copy)", "ensure_writable_batch (copy), per request"} <= prefix
    assert set(report["verdict"]) >= {"min_workload_speedup", "round_us_at_256", "speedup_met", "round_met"}
    assert report["verdict"]["round_us_at_256"] is None  # --quick does not run R = 256
    captured = capsys.readouterr()
    assert "speedup" in captured.out.splitlines()[0]
    assert "{" not in captured.out  # the table only: the JSON goes where --json says
    assert "[bench] decode R=32 spec" in captured.err
    drawn = chart.read_text()
    rounds = [row for row in rows if row["operation"] == "round"]
    assert all(f"R = {row['requests']}" in drawn for row in rounds)
    assert all(label in drawn for label in ("spec", "impl", "target at R = "))


def test_json_to_stdout_replaces_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] and report["verdict"]


def test_bench_refuses_impossible_arguments() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--quick", "--spec-rounds", "0"])
    assert caught.value.code == 2
