"""The proof runs: `python -m kvsched.proofs [--deep]`, `kvsched proofs`, and `kvsched verify`'s rows.

Prints the proof time of every transition and, per exploration, the bounds, states,
transitions and states per second; a counterexample is printed as a runnable program. Records
every run in MANIFEST.json in the current directory (this checkout: `make proofs` records to
proofs/MANIFEST.json), except under CI=true (CI's checkout stays clean) unless
`--manifest PATH` asks for it. Exit status 1 on any failed proof or counterexample.
`summary_rows(deep)` gives `kvsched verify` one row per proof or exploration.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvsched.proofs import manifest
from kvsched.proofs.explorer import Exploration, Explorer
from kvsched.proofs.inductive import GoalResult, prove, times_by_transition
from kvsched.proofs.invariant import CONJUNCTS
from kvsched.proofs.obligations import COVERS
from kvsched.proofs.operations import ISSUE, Bounds
from kvsched.proofs.subject import IMPL, SPEC, Subject
from kvsched.proofs.trace import reproduce
from kvsched.report import CommandParser, print_table


@dataclass(frozen=True)
class Run:
    """One exploration of a profile: what to explore, against what, within which bounds."""

    subject: Subject
    bounds: Bounds
    reference: Subject | None = None


CI: tuple[Run, ...] = (
    Run(SPEC, replace(ISSUE, max_depth=6)),
    Run(SPEC, Bounds(requests=2, pages=3, logical_pages=2, entries=1, entry_pages=2, max_external=1)),
    Run(IMPL, Bounds(requests=1, pages=2, logical_pages=1, entries=1, entry_pages=1), reference=SPEC),
    Run(IMPL, replace(ISSUE, max_depth=4), reference=SPEC),
)
"""About two minutes on two busy cores: the reference sizes to depth 6, every state of a 2-slot
system with 3 pages, 2 logical pages and a 2-page entry (the deep profile's largest closure
before pages were renamed), and impl in lockstep with the spec on every state of the smallest
system and to depth 4 at the reference sizes."""

DEEP: tuple[Run, ...] = (
    Run(SPEC, replace(ISSUE, max_depth=8)),
    Run(SPEC, Bounds(requests=3, pages=3, logical_pages=1, entries=1, entry_pages=1, max_external=1)),
    Run(IMPL, replace(ISSUE, max_depth=5), reference=SPEC),
    Run(IMPL, Bounds(requests=2, pages=2, logical_pages=1, entries=1, entry_pages=1, max_external=1), reference=SPEC),
)
"""About 12 minutes on two cores: the reference sizes to depth 8 (1.6 million classes in about 6
minutes; bounded by depth, never by time, so a slow machine explores the same states), every state of a 3-slot
system with 3 pages (about 200,000 classes), and impl in lockstep with the spec to depth 5 at
the reference sizes and on every state of a 2-slot system.

The issue's sizes do not close. Their BFS levels still grow about sevenfold per depth at depth
8 (1, 2, 11, 58, 397, 3,045, 23,885, 185,641, 1,422,613 classes), so depth 9 (some 375 million
transitions) alone would take more than 45 minutes. Closures that did not finish within 5 to 7
minutes either: R3 P3 L2 E1x1, R2 P4 L2 E1x2, R2 P3 L3 E2x2."""

Row = list[object]


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_proofs() -> tuple[list[GoalResult], float, Row]:
    """The z3 proofs; their results, time and summary row."""
    start = time.perf_counter()
    results = prove(progress=False)
    seconds = time.perf_counter() - start
    proved = all(result.outcome == "proved" for result in results)
    transitions = len(times_by_transition(results))
    row: Row = [
        "z3 inductive proofs (every size)",
        f"{len(results)} goals",
        f"{transitions} transitions",
        f"{len(CONJUNCTS)} conjuncts",
        "pass" if proved else "FAIL",
        f"{seconds:.1f}s",
    ]
    return results, seconds, row


def label(subject: str, b: Bounds, reference: str | None) -> str:
    """The name of an exploration in the summary table and the manifest."""
    sizes = f"R{b.requests} P{b.pages} L{b.logical_pages} E{b.entries}x{b.entry_pages}"
    extra = f" depth≤{b.max_depth}" if b.max_depth is not None else ""
    default = Bounds()
    for name, short in (("max_references", "refs"), ("max_tokens", "tokens"), ("max_external", "held")):
        if getattr(b, name) != getattr(default, name):
            extra += f" {short}≤{getattr(b, name)}"
    against = f" ⇄ {reference}" if reference is not None else ""
    return f"explorer: {subject}{against} {sizes}{extra}"


def _label(run: Run) -> str:
    return label(run.subject.name, run.bounds, run.reference.name if run.reference is not None else None)


def run_exploration(
    run: Run, progress: bool, workers: int = 0, ray: str | None = None, journal: str | None = None
) -> tuple[Exploration, Row, str]:
    """One exploration; its result, summary row and (on a violation) the runnable program. With
    `workers` (or `ray`) it runs on them (`kvsched.proofs.distributed`: the same states, counts and
    counterexample), going on from the journal in directory `journal` if it holds this
    exploration's last level."""
    if workers or ray:
        from kvsched.proofs.distributed import DistributedSearch, Level, Recipe, journal_file

        where = "Ray" if ray is not None else f"{max(workers, 1)} workers"

        def report(level: Level) -> None:
            _log(
                f"  depth {level.depth}: {level.states:,} states, {level.expanded:,} expanded in"
                f" {level.working + level.walking:.1f}s on {where}"
            )

        reference = None if run.reference is None else run.reference.name
        search = DistributedSearch(
            Recipe(run.bounds, run.subject.name, reference),
            workers=max(workers, 1),
            ray=ray,
            report=report if progress else None,
            partitions=max(workers, 1),  # the seen-set's parts, an owner each
            journal=journal_file(journal, _label(run)),
        )
        search.run()
        explorer = search.explorer
        result = explorer.result
    else:
        explorer = Explorer(run.bounds, run.subject, run.reference, _log if progress else None)
        result = explorer.run()
    program = reproduce(explorer, result.violation) if result.violation is not None else ""
    outcome = "pass" if result.violation is None else "FAIL"
    coverage = f"{result.states:,} states" + ("" if result.complete else " (stopped)")
    row: Row = [
        _label(run),
        coverage,
        f"{result.transitions:,}",
        f"{result.checks:,}",
        outcome,
        f"{result.seconds:.1f}s",
    ]
    return result, row, program


def execute(
    deep: bool,
    *,
    proofs: bool = True,
    explore: bool = True,
    progress: bool = True,
    workers: int = 0,
    ray: str | None = None,
    journal: str | None = None,
) -> tuple[list[Row], list[dict[str, Any]], list[str]]:
    """Run a profile: summary rows, manifest records, counterexample programs."""
    profile = "deep" if deep else "ci"
    rows: list[Row] = []
    records: list[dict[str, Any]] = []
    programs: list[str] = []
    if proofs:
        results, seconds, row = run_proofs()
        rows.append(row)
        records.append(manifest.proof_record(results, seconds, profile))
        if progress:
            print(f"{'transition':24} {'goals':>5} {'proof time':>12}  covers")
            for name, (goals, secs, proved) in times_by_transition(results).items():
                status = "" if proved else "  NOT PROVED"
                print(f"{name:24} {goals:5} {secs * 1000:9.1f} ms  {COVERS[name]}{status}")
            print()
    if explore:
        for run in DEEP if deep else CI:
            if progress:
                _log(f"{_label(run)} ...")
            result, row, program = run_exploration(run, progress, workers, ray, journal)
            rows.append(row)
            records.append(manifest.exploration_record(result, profile, _label(run)))
            if program:
                programs.append(program)
            if progress:
                _log(
                    f"  {result.states:,} states, {result.transitions:,} transitions in {result.seconds:.1f}s: "
                    f"{result.states_per_second:,.0f} states/s"
                )
    return rows, records, programs


def summary_rows(deep: bool = False) -> list[Row]:
    """Rows for `kvsched verify`: (name, states or goals, transitions, checks, outcome, time)."""
    rows, _, programs = execute(deep, progress=False)
    for program in programs:
        print(program, file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 0 when every proof holds and no exploration found a counterexample."""
    parser = CommandParser(
        prog="python -m kvsched.proofs", description="The z3 inductive proofs and the exhaustive explorer."
    )
    parser.add_argument("--deep", action="store_true", help="the largest bounds (tens of minutes)")
    parser.add_argument("--only", choices=["inductive", "explore"], help="run one half only")
    parser.add_argument(
        "--manifest",
        type=Path,
        help="where to record the runs (default ./MANIFEST.json; under CI=true nothing unless given)",
    )
    parser.add_argument("--no-manifest", action="store_true", help="do not record the runs")
    parser.add_argument(
        "--workers", type=int, default=0, help="run the spec's explorations on N worker processes (same results)"
    )
    parser.add_argument(
        "--ray", default=None, help="run the spec's explorations on a Ray cluster (ADDRESS, auto, local)"
    )
    parser.add_argument(
        "--journal", metavar="DIR", help="with --workers: each search's journal in DIR, to go on from if stopped"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `kvsched proofs -- --deep` passes the separator through
        argv = argv[1:]
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error("--workers takes a count of 0 or more")
    rows, records, programs = execute(
        args.deep,
        proofs=args.only in (None, "inductive"),
        explore=args.only in (None, "explore"),
        workers=args.workers,
        ray=args.ray,
        journal=args.journal,
    )
    print_table(rows, ["proof", "states / goals", "transitions", "checks", "outcome", "time"])
    for program in programs:
        print("\n" + program)
    path = manifest_path(args.manifest, args.no_manifest)
    if path is not None:
        whole = ("deep" if args.deep else "ci") if args.only is None else None
        manifest.record(records, path, whole)
    elif not args.no_manifest:
        _log(f"CI={os.environ.get('CI')}: {manifest.MANIFEST.name} not rewritten (pass --manifest PATH to record)")
    return 0 if all(row[4] == "pass" for row in rows) else 1


def in_ci() -> bool:
    """Running under CI (`.ci/run` exports CI=true), where the checkout must stay clean."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def manifest_path(given: Path | None, disabled: bool) -> Path | None:
    """Where to record the runs: the path given, else MANIFEST.json in the current directory
    unless under CI (never inside the installed package)."""
    if disabled:
        return None
    if given is not None:
        return given
    return None if in_ci() else manifest.MANIFEST
