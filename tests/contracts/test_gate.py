"""The CrossHair gate runs real CrossHair: it finds a counterexample in a deliberately broken
target, and treats a target that cannot even be loaded, or that runs out of time, as a failure.

The real targets and the whole broken corpus are the gate's own job: `make contracts` (in
`make verify` and in CI) runs both, so nothing here pays for that CrossHair time a second time;
here run two broken targets (iteration-bounded: the same verdict on every machine), the error
paths and the gate's own bookkeeping.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from devtools import broken_contracts as broken
from kvsched.contracts import gate


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


def test_broken_targets_yield_a_counterexample_within_their_iterations(tmp_path: Path) -> None:
    only = ("broken_contracts.kernel_ensure_rows", "broken_contracts.impl_retain")
    returncode, stdout, results = _gate(tmp_path, "--broken", *(f"--only={name}" for name in only))
    assert returncode == 0, stdout  # in --broken, success is a counterexample from every target
    assert sorted(str(result["name"]).removeprefix("devtools.") for result in results) == sorted(only)
    assert {result["outcome"] for result in results} == {"COUNTEREXAMPLE"}, stdout
    assert sorted(int(str(result["iterations"])) for result in results) == sorted(
        broken.ITERATIONS[name.removeprefix("broken_contracts.")] for name in only
    )
    assert all(float(str(result["cpu_seconds"])) > 0 for result in results)
    assert "false when calling" in stdout  # a check counterexample, with its inputs
    assert "Given: (" in stdout  # a diffbehavior counterexample, with its inputs


def test_a_target_past_its_cpu_limit_is_an_error() -> None:
    launcher = [sys.executable, "-m", "kvsched.contracts.launch", "--cpu-limit", "1", "--"]
    crosshair = ["check", "--per_condition_timeout", "600", "kvsched.contracts.spec_pool.pool_release"]
    done = subprocess.run([*launcher, *crosshair], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == -signal.SIGXCPU, done.stderr
    target = gate.Target("check", "t", ("m.f",), 1)
    result = gate.interpret(target, done.returncode, done.stdout, done.stderr, 1.0)
    assert result.outcome == "ERROR" and "CPU limit" in result.detail


def test_a_target_that_does_not_load_is_an_error() -> None:
    target = gate.Target("check", "missing", ("kvsched.contracts.no_such_module.contract",), 1)
    result = gate.run_target(target, 1.0, 1.0, deadline=time.monotonic() + 120)
    assert result.outcome == "ERROR" and "exit status 2" in result.detail


def test_a_target_past_its_time_is_an_error_not_a_pass() -> None:
    target = gate.all_targets(broken=False)[0]
    killed = gate.run_target(target, 30.0, 30.0, deadline=time.monotonic() + 1.0)
    assert killed.outcome == "ERROR" and "killed after" in killed.detail
    late = gate.run_target(target, 30.0, 30.0, deadline=time.monotonic() - 1.0)
    assert late.outcome == "ERROR" and "budget ran out" in late.detail


def test_the_largest_cpu_budgets_start_first() -> None:
    small, large = gate.Target("check", "s", ("m.s",), 1), gate.Target("check", "l", ("m.l",), 3)
    diff = gate.Target("diff", "d", ("m.spec_d", "m.impl_d"), 1)
    assert gate.schedule([small, diff, large], 2.0, 3.0) == [large, diff, small]
    assert gate.limit(large, 2.0, 3.0) == 2 * 6.0 + gate.STARTUP_SECONDS
    iterated = gate.Target("diff", "i", ("m.spec_i", "m.impl_i"), 1, iterations=50)
    assert "--max-iterations" in gate.command(iterated, 2.0, 3.0)
    assert gate.cpu_budget(iterated, 2.0, 3.0) == gate.ITERATION_GUARD


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


def test_the_gate_covers_every_contract_and_pair() -> None:
    targets = gate.all_targets(broken=False)
    checks = [target for target in targets if target.kind == "check"]
    assert len(checks) >= 26 and all(target.conditions >= 1 for target in checks)
    assert sum(target.conditions for target in checks) >= 60
    assert {target.name.rpartition(".")[2] for target in targets if target.kind == "diff"} >= {
        "retain",
        "release",
        "ensure",
        "pool",
        "writable",
        "store",
        "scheduler",
        "round",
        "round_buffers",
        "install",
        "batch",
        "engine_step",
    }


def _uncompiled_after_warming(pair_modules: str) -> list[str]:
    """`warm_kernel_cache` in a fresh process (pytest's own process has compiled everything)."""
    script = (
        "import kvsched.impl.lowering, kvsched.impl.prefix, kvsched.impl.writes\n"
        "from kvsched.contracts import gate\n"
        f"gate.PAIR_MODULES = {pair_modules}\n"
        "print(repr(gate.warm_kernel_cache()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    uncompiled: list[str] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return uncompiled


def test_the_gate_warms_every_impl_kernel_before_crosshair_starts() -> None:
    """A kernel first compiled under CrossHair's tracing takes minutes (a cold cache killed a pair
    at its 50 s limit): the samples the gate runs first must reach every impl kernel."""
    assert _uncompiled_after_warming("gate.PAIR_MODULES") == []
    without_samples = _uncompiled_after_warming("()")
    assert "kvsched.impl.page_kernels.ensure_rows" in without_samples
    assert len(without_samples) >= 10
