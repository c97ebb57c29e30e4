"""The CrossHair gate runs real CrossHair: it passes on real targets, finds a counterexample in
every deliberately broken target, and treats a target that cannot even be loaded as a failure.

`make contracts` runs the whole gate (about two and a half minutes on two cores); here CI runs a
sample of the real targets, every broken one, and the error paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from kvsched.contracts import broken, gate

SAMPLE = ("spec_pool.pool_release", "impl_kernels.kernel_apply_round", "twin_kernels.retain", "twin_systems.pool")


def _gate(tmp_path: Path, *arguments: str) -> tuple[int, str, list[dict[str, object]]]:
    report = tmp_path / "gate.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvsched.contracts", "--json", str(report), "--budget", "600", *arguments],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    results: list[dict[str, object]] = json.loads(report.read_text())["results"] if report.exists() else []
    return done.returncode, done.stdout, results


def test_every_broken_target_yields_a_counterexample(tmp_path: Path) -> None:
    returncode, stdout, results = _gate(tmp_path, "--broken")
    assert returncode == 1, stdout
    assert len(results) == len(broken.CHECK_TARGETS) + len(broken.DIFF_TARGETS)
    assert {result["outcome"] for result in results} == {"COUNTEREXAMPLE"}, stdout
    assert "false when calling" in stdout  # a check counterexample, with its inputs
    assert "Given: (" in stdout  # a diffbehavior counterexample, with its inputs


def test_a_sample_of_the_real_targets_passes(tmp_path: Path) -> None:
    only = [argument for name in SAMPLE for argument in ("--only", name)]
    returncode, stdout, results = _gate(tmp_path, *only)
    assert returncode == 0, stdout
    assert len(results) == len(SAMPLE)
    assert all(result["outcome"] == "pass" for result in results), stdout


def test_a_target_that_does_not_load_is_an_error() -> None:
    target = gate.Target("check", "missing", ("kvsched.contracts.no_such_module.contract",), 1)
    result = gate.run_target(target, 1.0, 1.0, deadline=time.monotonic() + 120)
    assert result.outcome == "ERROR" and "exit status 2" in result.detail


def test_crosshair_reports_are_read_strictly() -> None:
    target = gate.Target("check", "t", ("m.f",), 2)
    line = "/m.py:{}: info: {}"
    confirmed = "\n".join([line.format(3, "Confirmed over all paths."), line.format(4, "Not confirmed.")])
    assert gate.interpret(target, 0, confirmed, "", 1.0).outcome == "pass"
    assert gate.interpret(target, 0, confirmed, "", 1.0).confirmed == 1
    assert gate.interpret(target, 0, line.format(3, "Not confirmed."), "", 1.0).outcome == "ERROR"  # one missing
    vacuous = line.format(2, "Unable to meet precondition.")
    assert gate.interpret(target, 0, vacuous, "", 1.0).outcome == "ERROR"
    assert gate.interpret(target, 1, "/m.py:3: error: false when calling f(1)", "", 1.0).outcome == "COUNTEREXAMPLE"
    assert gate.interpret(target, 2, "", "Could not import your code", 1.0).outcome == "ERROR"
    diff = gate.Target("diff", "d", ("m.spec_x", "m.impl_x"), 1)
    assert gate.interpret(diff, 0, "No differences found. (attempted 9 iterations)", "", 1.0).outcome == "pass"
    assert gate.interpret(diff, 0, "", "", 1.0).outcome == "ERROR"


def test_the_gate_covers_every_contract_and_twin() -> None:
    targets = gate.all_targets(broken=False)
    checks = [target for target in targets if target.kind == "check"]
    assert len(checks) >= 26 and all(target.conditions >= 1 for target in checks)
    assert sum(target.conditions for target in checks) >= 60
    assert {target.name.rpartition(".")[2] for target in targets if target.kind == "diff"} >= {
        "retain",
        "release",
        "ensure",
        "pool",
        "store",
        "scheduler",
        "round",
        "install",
        "batch",
    }
