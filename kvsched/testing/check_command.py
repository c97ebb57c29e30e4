"""`kvsched check MODULE:FACTORY`: a bounded campaign against anyone's page manager, for CI.

Safety mode (the default) takes a `ManagerFactory` (`factory(pages, page_size)` returning a
`PageManager`, `kvsched.testing.adapter`) and runs `search_safety`. Exact mode takes a
`SystemFactory` (`kvsched.testing.system`) and runs the lockstep campaign against kvsched's spec,
which only kvsched's own implementation is meant to pass. Progress goes to stderr; a summary
table (or, with --json, one JSON object) to stdout; the exit status is 1 on a counterexample,
which is printed as a runnable program.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from kvsched.report import print_table


def resolve(target: str) -> tuple[str, str, Any]:
    """`MODULE:NAME` as (module, name, the object)."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise SystemExit(f"kvsched check: expected MODULE:FACTORY, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"kvsched check: cannot import {module_name}: {error}") from error
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise SystemExit(f"kvsched check: {module_name} has no {name}")
    return module_name, name, found


def run(args: argparse.Namespace) -> int:
    module, name, factory = resolve(args.target)
    if args.mode == "exact":
        return _exact(args, module, name, factory)
    from kvsched.testing.safety_search import search_safety

    def progress(programs: int) -> None:
        if programs % 50 == 0:
            print(f"[kvsched check] {args.target}: {programs} programs", file=sys.stderr, flush=True)

    result = search_safety(
        factory,
        examples=args.examples,
        steps=args.steps,
        seed_value=args.seed,
        pages=args.pages,
        page_size=args.page_size,
        shrink_seconds=args.shrink_seconds or None,
        source=(module, name),
        progress=progress,
    )
    summary = {
        "target": result.target,
        "mode": "safety",
        "outcome": "pass" if result.passed else "FAIL",
        "programs": result.programs,
        "steps": result.steps,
        "seed": result.seed,
        "cpu_seconds": round(result.seconds, 2),
        "check": None if result.failure is None else result.failure.kind.name,
        "detail": None if result.failure is None else result.failure.detail,
        "program_steps": result.program_steps,
        "shrink_cut_short": result.shrink_cut_short,
        "program": result.program,
        **result.calls,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        columns = [
            "target",
            "mode",
            "outcome",
            "programs",
            "admitted",
            "hit_tokens",
            "decoded",
            "refused",
            "cpu_seconds",
        ]
        print_table([[summary.get(column, 0) for column in columns]], columns)
        if result.program is not None:
            cut = " (shrinking was cut short by --shrink-seconds)" if result.shrink_cut_short else ""
            print(f"\n{result.failure}\n\ncounterexample, {result.program_steps} calls{cut}:\n\n{result.program}")
    return 0 if result.passed else 1


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
        print(json.dumps(summary, indent=2))
    else:
        columns = ["target", "mode", "outcome", "programs", "invariant_checks", "cpu_seconds"]
        print_table([[summary[column] for column in columns]], columns)
        if result.counterexample:
            print(f"\ncounterexample, a runnable reproduction:\n\n{result.counterexample}")
    return 0 if result.counterexample is None else 1
