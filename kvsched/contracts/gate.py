"""The CrossHair gate: every contract and every diff pair, each in its own bounded CrossHair run.

    python -m kvsched.contracts [--per-condition-timeout S] [--diff-timeout S] [--budget S]
                                [--jobs N] [--only TEXT ...] [--broken] [--json PATH]

Targets:
- `crosshair check` on every function with PEP316 conditions in `CHECK_MODULES` (spec
  transitions, impl kernels), one process per function, `--report_all` so every condition
  reports: each must be confirmed or unrefuted ("Unable to meet precondition" is an error: a
  contract nothing satisfies checks nothing), and as many must report as the docstring has;
- `crosshair diffbehavior spec_X impl_X` for every diff pair in `PAIR_MODULES`, after the
  pair's concrete samples (`kvsched.contracts.launch`).

Before the targets start, the gate runs every real diff pair's samples once, in the gate's process:
that compiles every kernel they reach into numba's cache, so the targets load it instead of each
compiling the same kernels at once, against its own time limit (a cold cache took longer than
a pair's 50 s).

Outcome per target: pass, COUNTEREXAMPLE (CrossHair exit 1, or a sample that differs) or ERROR
(exit 2, e.g. an import failure; a missing condition report; a process past its CPU limit, a
process hung past its wall-clock guard, or one the total `--budget` left no time for). Targets
start largest CPU budget first, `--jobs` at a time. The gate prints a table and exits 1 unless
every target passes.

Every bound that decides an outcome is one a loaded machine cannot tighten: CrossHair's own
timeouts are CPU seconds of its process, a process's limit is CPU seconds (RLIMIT_CPU), and the
wall-clock guards are generous multiples, there only to stop a process that hangs.

`--broken` runs the same gate on `devtools.broken_contracts`, where every target must yield a
counterexample (exit 0 when all do). There each search is bounded by iterations, not seconds
(`broken.ITERATIONS`): the same paths on every machine, so a counterexample found once is found
everywhere, and the CPU seconds are only a guard.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

from kvsched.contracts.launch import CPU_REPORT
from kvsched.report import CommandParser, write_json

CHECK_MODULES = (
    "kvsched.contracts.spec_pool",
    "kvsched.contracts.spec_prefix",
    "kvsched.contracts.spec_scheduler",
    "kvsched.contracts.impl_kernels",
)
PAIR_MODULES = ("kvsched.contracts.pair_kernels", "kvsched.contracts.pair_systems", "kvsched.contracts.pair_tables")
BROKEN_MODULE = "devtools.broken_contracts"
# The gate's explicit bounds. CPU seconds, CrossHair's own clock: per postcondition of a `check`
# (each is searched on its own) and per diff pair of a `diff` (both call orders together).
# 66 conditions x 2 s + 12 pairs x 4 s is 180 CPU seconds, about two minutes on two cores.
PER_CONDITION = 2.0
PER_DIFF = 4.0
# Wall seconds for the whole gate: a guard against hangs, far above the CPU it can need.
BUDGET = 1800.0
STARTUP_SECONDS = 30.0  # a process's CPU allowance beyond its conditions: imports, samples, slack
WALL_FACTOR = 10  # a process's wall-clock guard: its CPU limit this many times over
# An iteration-bounded search's CPU guard per condition or pair (its iterations bound it first).
ITERATION_GUARD = 300.0
_REPORT = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>info|error): (?P<message>.*)$")


@dataclass(frozen=True, slots=True)
class Target:
    """One CrossHair run: `check` of one contract function or `diff` of one diff pair."""

    kind: str
    name: str
    qualnames: tuple[str, ...]
    conditions: int
    samples: str | None = None  # "module:pair" whose samples run first
    iterations: int | None = None  # the search bound per condition or pair, when not CPU seconds


@dataclass(frozen=True, slots=True)
class Result:
    """How one target ended."""

    name: str
    kind: str
    conditions: int
    confirmed: int
    outcome: str
    seconds: float
    detail: str
    cpu_seconds: float = 0.0  # the launcher's own CPU time, as it reported it
    iterations: int | None = None  # the target's iteration bound, if it had one


def count_conditions(function: object) -> int:
    """The number of `post:` conditions in a PEP316 docstring (inline, or one per line of a
    `post:` block)."""
    conditions, block = 0, None
    for line in (inspect.getdoc(function) or "").splitlines():
        indent, stripped = len(line) - len(line.lstrip()), line.strip()
        if block is not None and stripped and indent > block:
            conditions += 1
            continue
        block = None
        if stripped.startswith("post:"):
            if stripped == "post:":
                block = indent
            else:
                conditions += 1
    return conditions


def check_targets(module_name: str, names: Sequence[str] | None = None) -> list[Target]:
    """A check target per function of `module_name` with postconditions (or the named ones)."""
    module = importlib.import_module(module_name)
    found = []
    for name, function in vars(module).items():
        if names is not None and name not in names:
            continue
        if not inspect.isfunction(function) or (names is None and function.__module__ != module_name):
            continue
        conditions = count_conditions(function)
        if conditions:
            found.append(Target("check", f"{module_name}.{name}", (f"{module_name}.{name}",), conditions))
    return found


def pair_targets(module_name: str) -> list[Target]:
    """A diff target per `spec_X`/`impl_X` pair of `module_name`."""
    module = importlib.import_module(module_name)
    return [
        Target(
            "diff",
            f"{module_name}.{name}",
            (f"{module_name}.spec_{name}", f"{module_name}.impl_{name}"),
            1,
            f"{module_name}:{name}",
        )
        for name in module.SAMPLES
    ]


def all_targets(broken: bool) -> list[Target]:
    """The gate's targets: the real ones, or the deliberately broken ones."""
    if not broken:
        targets = [target for module in CHECK_MODULES for target in check_targets(module)]
        return targets + [target for module in PAIR_MODULES for target in pair_targets(module)]
    module = importlib.import_module(BROKEN_MODULE)
    targets = [
        replace(target, iterations=module.ITERATIONS[target.name.rpartition(".")[2]])
        for target in check_targets(BROKEN_MODULE, module.CHECK_TARGETS)
    ]
    for spec_name, impl_name in module.DIFF_TARGETS:
        pair_module, _, spec_function = spec_name.rpartition(".")
        pair = spec_function.removeprefix("spec_")
        qualnames = (spec_name, f"{BROKEN_MODULE}.{impl_name}")
        targets.append(
            Target(
                "diff",
                f"{BROKEN_MODULE}.{impl_name}",
                qualnames,
                1,
                f"{pair_module}:{pair}",
                module.ITERATIONS[impl_name],
            )
        )
    return targets


def timeouts(target: Target, per_condition: float, per_diff: float) -> float:
    """The CPU seconds CrossHair may spend per condition (or per diff pair) of `target`."""
    if target.iterations is not None:
        return ITERATION_GUARD
    return per_condition if target.kind == "check" else per_diff


def command(target: Target, per_condition: float, per_diff: float) -> list[str]:
    """The launcher command line for one target."""
    launcher = [sys.executable, "-m", "kvsched.contracts.launch"]
    if target.samples:
        launcher += ["--samples", target.samples]
    if target.iterations is not None:
        launcher += ["--max-iterations", str(target.iterations)]
    launcher += ["--cpu-limit", f"{limit(target, per_condition, per_diff):.0f}"]
    timeout = str(timeouts(target, per_condition, per_diff))
    if target.kind == "check":
        crosshair = ["check", "--report_all", "--per_condition_timeout", timeout, *target.qualnames]
    else:
        crosshair = ["diffbehavior", "--per_condition_timeout", timeout, *target.qualnames]
    return [*launcher, "--", *crosshair]


def cpu_budget(target: Target, per_condition: float, per_diff: float) -> float:
    """The CPU seconds CrossHair may spend on a target: each condition is searched on its own."""
    return timeouts(target, per_condition, per_diff) * (target.conditions if target.kind == "check" else 1)


def limit(target: Target, per_condition: float, per_diff: float) -> float:
    """A process's CPU limit: its CPU budget twice over (CrossHair finishes the path it is on
    when a condition's time is up), plus startup."""
    return 2 * cpu_budget(target, per_condition, per_diff) + STARTUP_SECONDS


def schedule(targets: Sequence[Target], per_condition: float, per_diff: float) -> list[Target]:
    """The order to start targets in: largest CPU budget first (ties keep their order), so the
    parallel jobs end close together and no kind of target is always the one left for last."""
    return sorted(targets, key=lambda target: -cpu_budget(target, per_condition, per_diff))


def interpret(target: Target, returncode: int, stdout: str, stderr: str, seconds: float) -> Result:
    """Turn one CrossHair run into a `Result`."""
    reported = re.search(rf"^{re.escape(CPU_REPORT)} (?P<cpu>[0-9.]+)$", stderr, re.MULTILINE)
    cpu = float(reported.group("cpu")) if reported else 0.0

    def result(outcome: str, confirmed: int = 0, detail: str = "") -> Result:
        detail = detail.strip()
        return Result(
            target.name, target.kind, target.conditions, confirmed, outcome, seconds, detail, cpu, target.iterations
        )

    if returncode == -signal.SIGXCPU:
        return result("ERROR", detail="past its CPU limit (SIGXCPU)")
    if returncode == 1:
        return result("COUNTEREXAMPLE", detail=stdout or stderr)
    if returncode != 0:
        return result("ERROR", detail=f"exit status {returncode}\n{stdout}\n{stderr}")
    if target.kind == "diff":
        if "No differences found" not in stdout:
            return result("ERROR", detail=f"no verdict from diffbehavior\n{stdout}\n{stderr}")
        iterations = re.search(r"attempted (\d+) iterations", stdout)
        return result("pass", detail=f"{iterations.group(1) if iterations else '?'} iterations")
    reports = [match for line in stdout.splitlines() if (match := _REPORT.match(line))]
    unmet = [report.group(0) for report in reports if "Unable to meet precondition" in report.group("message")]
    if unmet:
        return result("ERROR", detail="vacuous contract:\n" + "\n".join(unmet))
    if len(reports) != target.conditions:
        return result("ERROR", detail=f"{len(reports)} of {target.conditions} conditions reported\n{stdout}\n{stderr}")
    confirmed = sum("Confirmed over all paths" in report.group("message") for report in reports)
    return result("pass", confirmed)


def run_target(target: Target, per_condition: float, per_diff: float, deadline: float) -> Result:
    """Run one target within its own limit and the gate's deadline."""
    started = time.perf_counter()
    timeout = min(WALL_FACTOR * limit(target, per_condition, per_diff), deadline - time.monotonic())
    if timeout <= 0:
        return Result(
            target.name, target.kind, target.conditions, 0, "ERROR", 0.0, "not run: the gate's budget ran out"
        )
    try:
        done = subprocess.run(
            command(target, per_condition, per_diff),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"},
        )
    except subprocess.TimeoutExpired:
        seconds = time.perf_counter() - started
        detail = f"killed after {timeout:.0f} s of wall-clock time"
        return Result(target.name, target.kind, target.conditions, 0, "ERROR", seconds, detail)
    return interpret(target, done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def warm_kernel_cache() -> list[str]:
    """Run every real diff pair's samples, compiling (or loading) the kernels they reach; the impl
    kernels they left uncompiled (each would compile inside CrossHair, which takes minutes).
    Outcomes are not judged here: each target runs its samples again and reports them."""
    from kvsched.contracts.launch import run_samples

    for module_name in PAIR_MODULES:
        for name in importlib.import_module(module_name).SAMPLES:
            try:
                run_samples(f"{module_name}:{name}")
            except Exception:  # the target itself reports the failure
                continue
    kernels = {
        f"{module_name}.{name}": value
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("kvsched.impl.") and module_name != "kvsched.impl.bench"
        for name, value in vars(module).items()
        if hasattr(value, "signatures") and getattr(value, "__module__", None) == module_name
    }
    return sorted(name for name, kernel in kernels.items() if not kernel.signatures)


def _short(name: str) -> str:
    return name.removeprefix("kvsched.contracts.")


def print_table(results: Sequence[Result], per_condition: float, per_diff: float) -> None:
    """The summary table, then every counterexample and error in full."""
    header = ("target", "kind", "conditions", "confirmed", "iterations", "outcome", "time", "cpu")
    rows = [
        (
            _short(r.name),
            r.kind,
            str(r.conditions),
            str(r.confirmed),
            str(r.iterations or "-"),
            r.outcome,
            f"{r.seconds:.1f}s",
            f"{r.cpu_seconds:.1f}s",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(f"crosshair check --per_condition_timeout {per_condition}; diffbehavior --per_condition_timeout {per_diff}")
    for index, row in enumerate([header, *rows]):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))
    for r in results:
        if r.outcome != "pass":
            print(f"\n{r.outcome} in {_short(r.name)}:\n{r.detail}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gate; 0 when every target passes (with `--broken`: every target yields a
    counterexample), else 1."""
    parser = CommandParser(prog="python -m kvsched.contracts", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--per-condition-timeout",
        type=float,
        default=PER_CONDITION,
        help=f"CPU seconds per condition ({PER_CONDITION})",
    )
    parser.add_argument("--diff-timeout", type=float, default=PER_DIFF, help=f"CPU seconds per diff pair ({PER_DIFF})")
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help=f"wall seconds for the whole gate, against hangs ({BUDGET:.0f})"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel runs (2)")
    parser.add_argument(
        "--only", action="append", default=[], help="run only targets whose name contains this text (repeatable)"
    )
    parser.add_argument("--broken", action="store_true", help="run on the deliberately broken targets")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-': stdout)")
    args = parser.parse_args(argv)
    targets = [
        target for target in all_targets(args.broken) if not args.only or any(o in target.name for o in args.only)
    ]
    if not targets:
        print(f"no target matches {args.only!r}", file=sys.stderr)
        return 1
    conditions = sum(target.conditions for target in targets)
    print(f"{len(targets)} targets, {conditions} conditions, {args.jobs} jobs", file=sys.stderr)
    started, deadline = time.perf_counter(), time.monotonic() + args.budget
    cold = warm_kernel_cache()
    print(f"kernel cache warm after {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if cold:
        print(f"warning: no sample compiled {', '.join(cold)}", file=sys.stderr)
    results: list[Result] = []

    def run(target: Target) -> Result:
        result = run_target(target, args.per_condition_timeout, args.diff_timeout, deadline)
        results.append(result)
        print(
            f"[{len(results)}/{len(targets)}] {_short(result.name)}: {result.outcome} {result.seconds:.1f}s",
            file=sys.stderr,
        )
        return result

    order = schedule(targets, args.per_condition_timeout, args.diff_timeout)
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        finished = dict(zip(order, pool.map(run, order), strict=True))
    ordered = [finished[target] for target in targets]
    elapsed = time.perf_counter() - started
    print_table(ordered, args.per_condition_timeout, args.diff_timeout)
    expected = "COUNTEREXAMPLE" if args.broken else "pass"
    failed = [result for result in ordered if result.outcome != expected]
    verdict = "yield a counterexample" if args.broken else "pass"
    slowest = max(ordered, key=lambda result: result.cpu_seconds)
    print(
        f"\n{len(ordered) - len(failed)} of {len(ordered)} targets {verdict}; {elapsed:.0f} s "
        f"(guard {args.budget:.0f} s); most CPU: {_short(slowest.name)}, {slowest.cpu_seconds:.1f} s"
    )
    if args.json:
        write_json(args.json, {"seconds": elapsed, "results": [asdict(result) for result in ordered]})
    return 1 if failed else 0
