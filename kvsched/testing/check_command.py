"""`kvsched check MODULE:FACTORY`: a bounded campaign against anyone's page manager, for CI.

Safety mode (the default) takes a `ManagerFactory` (`factory(pages, page_size)` returning a
`PageManager`, `kvsched.testing.adapter`) and runs `search_safety`. Exact mode takes a
`SystemFactory` (`kvsched.testing.system`) and runs the lockstep campaign against kvsched's spec,
which only kvsched's own implementation is meant to pass. With `--workers`, `--ray`, `--shard` or
`--journal`, a safety campaign is cut into shards of seeds (`kvsched.testing.campaign_shards`).
With `--failures DIR`, the findings stored there for the target replay first, and a campaign's
counterexample is stored there (`kvsched.testing.failures`).
Progress goes to stderr; a summary table to stdout (or one JSON document with `--json`). Exit
status: 0 every check passed, 1 a counterexample (printed as a runnable program) or, with
`--strict`, a coverage warning; usage and configuration errors are the CLI's `UsageError` (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from pathlib import Path
from typing import Any

from kvsched.report import Progress, UsageError, print_table, require_writable, write_json
from kvsched.testing.failures import BadFinding, FailureStore, from_program, replay_all
from kvsched.testing.safety import NotAnAdapter
from kvsched.testing.safety_search import (
    SHRINKS,
    BadSetting,
    SafetyResult,
    check_settings,
    program_text,
    search_safety,
)


def resolve(target: str) -> tuple[str, str, Any]:
    """`MODULE:NAME` as (module, name, the object), importing from the current directory as
    `python -m` does; a `UsageError` when it cannot."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise UsageError(f"kvsched check: expected MODULE:FACTORY, got {target!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"kvsched check: cannot import {module_name}: {error}") from error
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise UsageError(f"kvsched check: {module_name} has no {name}")
    if not callable(found):
        raise UsageError(f"kvsched check: {target} is not callable (a factory: factory(pages, page_size))")
    return module_name, name, found


SAFETY_ONLY = {
    "pages": "--pages",
    "page_size": "--page-size",
    "shrinks": "--shrinks",
    "strict": "--strict",
    "workers": "--workers",
    "ray": "--ray",
    "shard": "--shard",
    "journal": "--journal",
    "failures": "--failures",
}


def run(args: argparse.Namespace) -> int:
    if args.json not in (None, "-"):
        require_writable(args.json, "kvsched check")
    module, name, factory = resolve(args.target)
    if args.mode == "exact":
        given = [option for field, option in SAFETY_ONLY.items() if getattr(args, field) not in (None, False)]
        if given:
            raise UsageError(f"kvsched check: {', '.join(given)}: safety mode only (not with --mode exact)")
        if args.examples < 1 or args.steps < 1:
            raise UsageError(
                f"kvsched check: --examples and --steps must be at least 1, not {args.examples}, {args.steps}"
            )
        if not _takes(factory, 1):
            raise UsageError(
                f"kvsched check: --mode exact takes a SystemFactory, factory(config); {args.target} does not take"
                " one argument (a page-manager factory, factory(pages, page_size), runs in safety mode: drop --mode)"
            )
        return _exact(args, module, name, factory)
    page_size = 2 if args.page_size is None else args.page_size
    try:
        check_settings(
            examples=args.examples,
            steps=args.steps,
            pages=args.pages,
            page_size=page_size,
            shrinks=SHRINKS if args.shrinks is None else args.shrinks,
        )
    except BadSetting as error:
        raise UsageError(f"kvsched check: {_option(str(error))}") from error
    store = None if args.failures is None else _store(args.failures)
    if store is not None:
        replayed = _replay_stored(args, store, factory, (module, name), page_size)
        if replayed is not None:
            return replayed
    if args.workers is not None or args.ray is not None or args.journal is not None or args.shard is not None:
        return _kept(args, store, *_sharded(args, factory, page_size))
    with Progress(f"kvsched check {args.target}", args.examples) as progress:
        try:
            result = search_safety(
                factory,
                examples=args.examples,
                steps=args.steps,
                seed_value=args.seed,
                pages=args.pages,
                page_size=page_size,
                shrinks=SHRINKS if args.shrinks is None else args.shrinks,
                source=(module, name),
                progress=lambda programs, shrinking: progress.update(programs, "shrinking" if shrinking else ""),
            )
        except NotAnAdapter as error:
            raise UsageError(f"kvsched check: {args.target}: {error}") from error
    return _kept(args, store, result, {"seed": result.seed})


def _store(directory: str) -> FailureStore:
    try:
        return FailureStore(Path(directory))
    except BadFinding as error:
        raise UsageError(f"kvsched check: --failures {error}") from error


def _replay_stored(
    args: argparse.Namespace, store: FailureStore, factory: Any, source: tuple[str, str], page_size: int
) -> int | None:
    """Replay the findings stored for this target and page size: the first that still fails is
    reported as the campaign's result (its exit status); None when none does, and the search runs."""
    try:
        findings = store.findings(args.target, page_size)
        started = time.process_time()
        found, replayed = replay_all(factory, findings)
    except BadFinding as error:
        raise UsageError(f"kvsched check: --failures {error}") from error
    except NotAnAdapter as error:
        raise UsageError(f"kvsched check: {args.target}: {error}") from error
    if found is None:
        if findings:
            print(
                f"kvsched check: {replayed} stored findings replayed from {store.directory}: each passes now",
                file=sys.stderr,
            )
        return None
    path, finding, failure = found
    result = SafetyResult(
        target=args.target,
        programs=replayed,
        steps=sum(len(finding.calls) for _, finding in findings[:replayed]),
        seed=args.seed,
        seconds=time.process_time() - started,
        failure=failure,
        program=program_text(failure, source, finding.pages, finding.page_size, finding.calls),
        program_steps=len(finding.calls),
    )
    return _report(args, result, {"replayed": str(path)})


def _kept(args: argparse.Namespace, store: FailureStore | None, result: SafetyResult, where: dict[str, Any]) -> int:
    """Report the campaign; with a store, keep its counterexample there."""
    status = _report(args, result, where)
    if store is not None and result.failure is not None and result.program is not None:
        path = store.add(from_program(args.target, result.program, result.failure))
        print(f"kvsched check: the counterexample is stored as {path}", file=sys.stderr)
    return status


def _report(args: argparse.Namespace, result: SafetyResult, where: dict[str, Any]) -> int:
    """Print (or write as JSON) a safety campaign's result; its exit status. `where` names the
    seeds it ran (and, sharded, its workers and shards)."""
    summary = {
        "target": result.target,
        "mode": "safety",
        "outcome": "pass" if result.passed else "FAIL",
        "programs": result.programs,
        "steps": result.steps,
        **where,
        "cpu_seconds": round(result.seconds, 2),
        "check": None if result.failure is None else result.failure.kind.name,
        "detail": None if result.failure is None else result.failure.detail,
        "program_steps": result.program_steps,
        "program": result.program,
        "coverage": result.coverage,
        "warnings": list(result.warnings),
    }
    if args.json:
        write_json(args.json, summary)
    if args.json != "-":
        columns = ["target", "mode", "outcome", "programs", *where, "cpu_seconds"]
        print_table([[summary[column] for column in columns]], columns)
        print()
        print_table([list(result.coverage.values())], list(result.coverage))
        for warning in result.warnings:
            print(f"\nwarning: {warning}")
        if result.program is not None:
            print(f"\n{result.failure}\n\ncounterexample, {result.program_steps} calls:\n\n{result.program}")
    return 1 if not result.passed or (args.strict and result.warnings) else 0


def _sharded(args: argparse.Namespace, factory: Any, page_size: int) -> tuple[SafetyResult, dict[str, Any]]:
    """The campaign cut into shards of seeds over workers (`kvsched.testing.campaign_shards`):
    its merged result, and the workers, shards and seeds it ran."""
    from kvsched.testing import campaign_shards
    from kvsched.testing.workers import RayMissing, WorkerLost

    if args.ray is not None and args.workers is not None:
        raise UsageError("kvsched check: --workers or --ray, not both (Ray decides its own workers)")
    workers = 1 if args.workers is None else args.workers
    shard = campaign_shards.SHARD if args.shard is None else args.shard
    if workers < 1 or shard < 1:
        raise UsageError(f"kvsched check: --workers and --shard must be at least 1, not {workers}, {shard}")
    journal = None if args.journal is None else Path(args.journal)
    if journal is not None:
        require_writable(args.journal, "kvsched check")
    shards = campaign_shards.plan(
        args.target,
        examples=args.examples,
        seed=args.seed,
        steps=args.steps,
        pages=args.pages,
        page_size=page_size,
        shrinks=SHRINKS if args.shrinks is None else args.shrinks,
        shard=shard,
    )
    with Progress(f"kvsched check {args.target}", len(shards)) as progress:
        try:
            result, _ = campaign_shards.run_campaign(
                shards,
                factory,
                workers=workers,
                ray=args.ray,
                journal=journal,
                progress=lambda line: progress.note(line),
            )
        except (RayMissing, campaign_shards.ForeignJournal) as error:
            raise UsageError(f"kvsched check: {error}") from error
        except WorkerLost as error:
            raise UsageError(f"kvsched check: {args.target}: {error} (the manager kills its process)") from error
    last = shards[-1]
    where = f"ray {args.ray}" if args.ray is not None else workers
    return result, {"workers": where, "shards": len(shards), "seeds": f"{args.seed}..{last.seed}"}


def _option(message: str) -> str:
    """A `BadSetting` message in the command's words: `--page-size must be ...`."""
    setting, _, rest = message.partition(" must ")
    return f"--{setting.replace(' ', '-')} must {rest}"


def _takes(factory: Any, count: int) -> bool:
    """`factory` accepts `count` positional arguments (True when its signature cannot be read)."""
    try:
        inspect.signature(factory).bind(*range(count))
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): let the call say
        return True
    return True


def _exact(args: argparse.Namespace, module: str, name: str, factory: Any) -> int:
    from kvsched.testing.campaign import run_campaign
    from kvsched.testing.system import spec_system

    setup = (
        f"from kvsched.testing.system import spec_system\nfrom {module} import {name} as factory\n"
        "reference = spec_system"
    )
    result = run_campaign(
        args.target, factory, spec_system, examples=args.examples, steps=args.steps, random_seed=args.seed, setup=setup
    )
    summary = {
        "target": args.target,
        "mode": "exact",
        "outcome": result.outcome,
        "programs": result.examples,
        "invariant_checks": result.invariant_checks,
        "cpu_seconds": round(result.seconds, 2),
        "program": result.counterexample,
    }
    if args.json:
        write_json(args.json, summary)
    if args.json != "-":
        columns = ["target", "mode", "outcome", "programs", "invariant_checks", "cpu_seconds"]
        print_table([[summary[column] for column in columns]], columns)
        if result.counterexample:
            print(f"\ncounterexample, a runnable reproduction:\n\n{result.counterexample}")
    return 0 if result.counterexample is None else 1
