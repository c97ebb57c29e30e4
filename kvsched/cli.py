"""The `kvsched` command.

kvsched verify   the model-checking campaigns (and the proofs), with a summary table
kvsched proofs   the inductive proofs and the exhaustive explorer
kvsched bench    spec vs impl bookkeeping; `kvsched bench decode` the decode kernels
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from collections.abc import Sequence
from typing import Any

from kvsched.report import print_table
from kvsched.testing.campaign import CampaignResult, run_campaign
from kvsched.testing.impl_system import impl_system
from kvsched.testing.system import SystemFactory, spec_system
from kvsched.testing.variants import VARIANTS

PROFILES = {"fast": (200, 50), "deep": (5000, 100)}


def _optional(module: str, attribute: str) -> Any | None:
    """An attribute of a component that may not be built into this checkout yet."""
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None


Campaign = tuple[str, SystemFactory, SystemFactory | None, str]
SPEC_SETUP = "from kvsched.testing.system import spec_system"
IMPL_SETUP = "from kvsched.testing.impl_system import impl_system"


def _campaigns(variant: str | None) -> list[Campaign]:
    if variant is not None:
        setup = f"from kvsched.testing.variants import VARIANTS\nfactory, reference = VARIANTS[{variant!r}], None"
        return [(f"spec variant: {variant}", VARIANTS[variant], None, setup)]
    return [
        (
            "spec (invariants, atomicity, ghost reads)",
            spec_system,
            None,
            f"{SPEC_SETUP}\nfactory, reference = spec_system, None",
        ),
        (
            "impl ⇄ spec lockstep",
            impl_system,
            spec_system,
            f"{SPEC_SETUP}\n{IMPL_SETUP}\nfactory, reference = impl_system, spec_system",
        ),
    ]


def command_verify(args: argparse.Namespace) -> int:
    """Run every campaign (and the proofs unless --no-proofs); non-zero on any counterexample."""
    examples, steps = PROFILES[args.profile]
    examples = args.examples or examples
    steps = args.steps or steps
    results: list[CampaignResult] = []
    for name, factory, reference, setup in _campaigns(args.variant):
        results.append(
            run_campaign(name, factory, reference, examples=examples, steps=steps, random_seed=args.seed, setup=setup)
        )
    rows: list[list[object]] = [
        [r.machine, r.examples, r.steps, r.invariant_checks, r.outcome, f"{r.seconds:.1f}s"] for r in results
    ]
    failed = any(result.counterexample for result in results)
    proof_rows = _optional("kvsched.proofs", "summary_rows")
    if proof_rows is not None and not args.no_proofs and args.variant is None:
        for row in proof_rows(deep=args.profile == "deep"):
            rows.append(list(row))
            failed = failed or row[4] != "pass"
    print(f"kvsched verify on {platform.node() or 'this machine'} (seed {args.seed}, {steps} steps per example)")
    print_table(rows, ["machine", "examples", "steps", "invariants checked", "outcome", "time"])
    for result in results:
        if result.counterexample:
            print(f"\ncounterexample for {result.machine} — a runnable reproduction:\n")
            print(result.counterexample)
    if args.json:
        payload = [row[:4] + [row[4], row[5]] for row in rows]
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)
    return 1 if failed else 0


def _delegate(module: str, argv: list[str]) -> int:
    main = _optional(module, "main")
    if main is None:
        print(f"{module} is not part of this build", file=sys.stderr)
        return 2
    result: int = main(argv)
    return result


BENCH_TARGETS = {"bookkeeping": "kvsched.impl.bench", "decode": "kvsched.kernels.bench"}
DELEGATED = {"proofs": "kvsched.proofs", "mutants": "kvsched.testing.mutants"}


def _delegated(argv: list[str]) -> tuple[str, list[str]] | None:
    """The module and arguments of a delegated command (`proofs`, `mutants`, `bench`), untouched:
    its own parser reads them in their order (`--only inductive`, `--plot PATH`)."""
    if not argv:
        return None
    command, rest = argv[0], argv[1:]
    if command in DELEGATED:
        return DELEGATED[command], rest
    if command == "bench":
        if rest and rest[0] in BENCH_TARGETS:
            return BENCH_TARGETS[rest[0]], rest[1:]
        return BENCH_TARGETS["bookkeeping"], rest
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsched", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="run the model-checking campaigns and the proofs")
    verify.add_argument("--examples", type=int, default=0, help="programs per campaign (default: by profile)")
    verify.add_argument("--steps", type=int, default=0, help="operations per program (default: by profile)")
    verify.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    verify.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    verify.add_argument("--no-proofs", action="store_true", help="skip the proofs")
    verify.add_argument("--json", help="also write the summary table as JSON here")
    verify.add_argument(
        "--variant", choices=sorted(VARIANTS), help="check a deliberately broken spec variant instead (must fail)"
    )
    verify.set_defaults(run=command_verify)
    # The delegated commands are listed for --help; main() hands their arguments on untouched.
    commands.add_parser("proofs", help="the z3 proofs and the exhaustive explorer")
    commands.add_parser("bench", help="benchmarks: bookkeeping (default) or `bench decode`")
    commands.add_parser("mutants", help="run the harness on every broken variant of impl")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvsched` console command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(arguments)
    if delegated is not None:  # options and values go on to the command's own parser, in order
        return _delegate(*delegated)
    args = build_parser().parse_args(arguments)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
