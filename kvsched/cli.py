"""The `kvsched` command.

kvsched verify      the model-checking campaigns and the proofs, with a summary table
                    (needs the `verify` extra; `--no-proofs`: the `testing` extra)
kvsched check       anyone's page manager under the safety harness: kvsched check MODULE:FACTORY
kvsched proofs      the z3 inductive proofs and the exhaustive explorer (`verify` extra)
kvsched contracts   the CrossHair gate over every contract and twin pair (`verify` extra)
kvsched bench       spec vs impl bookkeeping; `bench decode` the decode kernels; `bench engine` step();
                    `bench thrash` the recomputation under KV pressure, by admission policy;
                    `bench tiers` a multi-turn workload with and without a host tier;
                    `bench router` engines behind a router's index, by longest cached prefix

Exit status: 0 every check passed; 1 a counterexample or a failed check; 2 a usage, import,
configuration or missing-extra error (one line on stderr). `--json PATH` writes one JSON
document to PATH (`-`: to stdout, instead of the table), numbers as numbers.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

from kvsched.report import CommandParser, UsageError, print_table, require_writable, write_json

# The optional dependencies, and the extra a command needs for them.
OPTIONAL = {"hypothesis", "z3", "crosshair", "matplotlib"}
EXTRA_OF = {
    "proofs": "verify",
    "contracts": "verify",
    "verify": "verify",
    "verify --no-proofs": "testing",
    "check": "testing",
    "bench": "bench",
}


class MissingExtra(UsageError):
    """A command needs a dependency this installation lacks."""

    def __init__(self, command: str, module: str) -> None:
        extra = EXTRA_OF.get(command, "dev")
        super().__init__(
            f"kvsched {command} needs {module}, from the '{extra}' extra: pip install '.[{extra}]' in a kvsched"
            f" checkout (or the wheel with [{extra}])"
        )


def load(module: str, command: str) -> ModuleType:
    """Import `module` for `command`; a missing optional dependency is a `MissingExtra`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in OPTIONAL:
            raise
        raise MissingExtra(command, missing) from error


PROFILES = {"fast": (200, 50), "deep": (5000, 100)}


def command_verify(args: argparse.Namespace) -> int:
    """Run every campaign (and the proofs unless --no-proofs); non-zero on any counterexample."""
    if args.examples < 0 or args.steps < 0:
        given = f"{args.examples}, {args.steps}"
        raise UsageError(f"kvsched verify: --examples and --steps must be at least 1 (0: the profile's), not {given}")
    if args.json not in (None, "-"):
        require_writable(args.json, "kvsched verify")
    examples, steps = PROFILES[args.profile]
    examples = args.examples or examples
    steps = args.steps or steps
    needs = "verify --no-proofs" if args.no_proofs or args.variant is not None else "verify"
    if (args.workers is not None and args.workers < 1) or args.shard < 1:
        raise UsageError(f"kvsched verify: --workers and --shard take 1 or more, not {args.workers}, {args.shard}")
    variants = load("kvsched.testing.variants", needs).VARIANTS
    if args.variant is not None and args.variant not in variants:
        known = ", ".join(sorted(variants))
        raise UsageError(f"kvsched verify: no variant {args.variant!r}; the variants are: {known}")
    proofs = None if args.no_proofs or args.variant is not None else load("kvsched.proofs.runner", "verify")
    results = _campaigns(args, examples, steps, needs)
    json_rows: list[list[object]] = [
        [r.machine, r.examples, r.steps, r.invariant_checks, r.outcome, round(r.seconds, 2)] for r in results
    ]
    failed = any(result.counterexample for result in results)
    if proofs is not None:
        for row in proofs.summary_rows(deep=args.profile == "deep"):
            json_rows.append([*row[:5], _seconds(row[5])])
            failed = failed or row[4] != "pass"
    out = sys.stderr if args.json == "-" else sys.stdout
    where = platform.node() or "this machine"
    print(f"kvsched verify on {where} (seed {args.seed}, {steps} steps per example)", file=out)
    print_table([[*row[:5], f"{row[5]}s"] for row in json_rows], VERIFY_COLUMNS, file=out)
    for result in results:
        if result.counterexample:
            print(f"\ncounterexample for {result.machine} — a runnable reproduction:\n", file=out)
            print(result.counterexample, file=out)
    if args.json:
        write_json(args.json, [dict(zip(VERIFY_COLUMNS, row, strict=True)) for row in json_rows])
    return 1 if failed else 0


def _campaigns(args: argparse.Namespace, examples: int, steps: int, needs: str) -> list[Any]:
    """`kvsched verify`'s campaign rows, in order: with `--failures`, a campaign whose stored
    counterexample still fails is that finding (not searched); the others run, on workers when
    asked, and store what they find."""
    campaign = load("kvsched.testing.campaign", needs)
    sharding = load("kvsched.testing.verify_shards", needs)
    stored = load("kvsched.testing.verify_failures", needs)
    store = None
    if args.failures is not None:
        try:
            store = stored.ProgramStore(Path(args.failures))
        except stored.BadFinding as error:
            raise UsageError(f"kvsched verify --failures: {error}") from error
    planned = sharding.campaigns(args.variant)
    results: dict[int, Any] = {}
    for index, (name, factory, reference, setup) in enumerate(planned if store is not None else ()):
        try:
            replayed = stored.replay_stored(store, name, factory, reference, setup)
        except stored.BadFinding as error:
            raise UsageError(f"kvsched verify --failures: {error}") from error
        if replayed.failing is not None:
            path, program = replayed.failing
            print(f"{name}: the stored counterexample {path} still fails; not searched", file=sys.stderr)
            results[index] = stored.replayed_result(name, program)
        elif replayed.count:
            print(f"{name}: {replayed.count} stored counterexample(s) pass now", file=sys.stderr)
    searched = [index for index in range(len(planned)) if index not in results]
    if args.workers is not None or args.ray is not None:  # the campaigns cut into shards of seeds
        rows = sharding.run_sharded(
            args.variant,
            examples=examples,
            steps=steps,
            seed=args.seed,
            workers=args.workers or 1,
            ray=args.ray,
            shard=args.shard,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            only=searched,
        )
    else:
        rows = [
            campaign.run_campaign(
                planned[index][0],
                planned[index][1],
                planned[index][2],
                examples=examples,
                steps=steps,
                random_seed=args.seed,
                setup=planned[index][3],
            )
            for index in searched
        ]
    for index, row in zip(searched, rows, strict=True):
        results[index] = row
        if store is not None and row.counterexample:
            path = store.add(stored.from_counterexample(row.machine, row.counterexample))
            print(f"{row.machine}: its counterexample stored as {path}", file=sys.stderr)
    return [results[index] for index in range(len(planned))]


VERIFY_COLUMNS = ["machine", "examples", "steps", "invariants checked", "outcome", "seconds"]


def _seconds(cell: object) -> float:
    """A proofs summary's time cell ("1.2s") as a number."""
    return float(str(cell).rstrip("s"))


def _delegate(command: str, module: str, argv: list[str]) -> int:
    for needed in REQUIRES.get(command, ()):
        load(needed, command)
    if command == "bench" and "--plot" in argv:  # refused before the run, not after it
        load("matplotlib", command)
    result: int = load(module, command).main(argv)
    return result


BENCH_TARGETS = {
    "bookkeeping": "kvsched.impl.bench",
    "decode": "kvsched.kernels.bench",
    "engine": "kvsched.impl.engine_bench",
    "thrash": "kvsched.impl.thrash_bench",
    "tiers": "kvsched.impl.tier_bench",
    "router": "kvsched.impl.router_bench",
}
DELEGATED = {"proofs": "kvsched.proofs.runner", "contracts": "kvsched.contracts.gate"}
REQUIRES = {"contracts": ("crosshair",)}  # the gate runs CrossHair in worker processes


def _delegated(argv: list[str]) -> tuple[str, str, list[str]] | None:
    """The command, module and arguments of a delegated command (`proofs`, `contracts`, `bench`),
    untouched: its own parser reads them in their order (`--only inductive`, `--plot PATH`)."""
    if not argv:
        return None
    command, rest = argv[0], argv[1:]
    if command in DELEGATED:
        return command, DELEGATED[command], rest
    if command == "bench":
        if rest and rest[0] in BENCH_TARGETS:
            return command, BENCH_TARGETS[rest[0]], rest[1:]
        return command, BENCH_TARGETS["bookkeeping"], rest
    return None


CHECK_HELP = """Check anyone's page manager, a bounded campaign for CI.

modes:
  safety (default)  MODULE:FACTORY is factory(pages, page_size) -> a PageManager adapter
                    (kvsched.testing.adapter). Hypothesis plays an engine over it (admit, decode,
                    finish, preempt, fork, lookup/commit, leases, the host tier: whatever its
                    capabilities declare) and checks every view: ghost reads, exclusive writes,
                    holder counts, leases, host pages. A failure prints a runnable program.
  exact             MODULE:FACTORY is a SystemFactory, factory(config): it runs in lockstep with
                    kvsched's spec; meant for kvsched's own implementation.

The verdict is a function of the seed (default 0) and the options alone, never of the machine's
speed. Exit status: 0 every check passed; 1 a counterexample (or, with --strict, a coverage
warning); 2 a usage, import or configuration error (one line on stderr)."""


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="MODULE:FACTORY (safety: factory(pages, page_size) -> PageManager)")
    parser.add_argument("--mode", choices=("safety", "exact"), default="safety", help="see above (default safety)")
    parser.add_argument("--examples", type=int, default=1000, help="programs to generate (default 1000)")
    parser.add_argument("--steps", type=int, default=30, help="calls per program (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="the campaign's seed (default 0)")
    parser.add_argument(
        "--pages", type=int, default=None, help="safety: pages per manager, 1-4096 (default: drawn from 4, 6, 8, 16)"
    )
    parser.add_argument("--page-size", type=int, default=None, help="safety: tokens per page, 1-256 (default 2)")
    parser.add_argument("--shrinks", type=int, default=None, help="safety: programs shrinking may run (default 1500)")
    parser.add_argument("--strict", action="store_true", help="safety: exit 1 on a coverage warning too")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH ('-': stdout, no table)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="safety: cut the campaign into shards of seeds (seed, seed+1, ...) run by N local processes;"
        " the verdict and program are the same for any N",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="safety: run the shards on a Ray cluster: 'auto' (the one this machine belongs to), 'local' (start"
        " one here) or an address (needs kvsched[ray])",
    )
    parser.add_argument("--shard", type=int, default=None, help="safety: programs per shard (default 100)")
    parser.add_argument(
        "--failures",
        metavar="DIR",
        default=None,
        help="safety: replay every finding stored in DIR first; store the counterexample a campaign finds",
    )
    parser.add_argument(
        "--journal", metavar="FILE", default=None, help="safety: record finished shards in FILE; a rerun resumes"
    )


def command_check(args: argparse.Namespace) -> int:
    """A bounded campaign against MODULE:FACTORY; non-zero on a counterexample."""
    check: Any = load("kvsched.testing.check_command", "check")
    result: int = check.run(args)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="kvsched", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvsched {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="run the model-checking campaigns and the proofs")
    verify.add_argument("--examples", type=int, default=0, help="programs per campaign (default: by profile)")
    verify.add_argument("--steps", type=int, default=0, help="operations per program (default: by profile)")
    verify.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    verify.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    verify.add_argument("--no-proofs", action="store_true", help="skip the proofs")
    verify.add_argument("--json", metavar="PATH", help="write the summary as JSON to PATH ('-': stdout, no table)")
    verify.add_argument("--variant", help="check a deliberately broken spec variant instead (must fail)")
    verify.add_argument(
        "--workers", type=int, default=None, help="cut each campaign into shards of seeds run on N processes"
    )
    verify.add_argument("--ray", metavar="ADDRESS", help="run the shards on a Ray cluster (auto, local, or an address)")
    verify.add_argument("--shard", type=int, default=50, help="programs per shard with --workers or --ray (default 50)")
    verify.add_argument(
        "--failures", metavar="DIR", help="run every counterexample stored in DIR first; store the ones found"
    )
    verify.set_defaults(run=command_verify)
    check = commands.add_parser(
        "check",
        help="check anyone's page manager: kvsched check MODULE:FACTORY",
        description=CHECK_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.set_defaults(run=command_check)
    _check_arguments(check)
    # The delegated commands are listed for --help; main() hands their arguments on untouched.
    commands.add_parser("proofs", help="the z3 proofs and the exhaustive explorer")
    commands.add_parser(
        "bench",
        help="benchmarks: bookkeeping (default), `bench decode`, `bench engine`, `bench thrash` or `bench tiers`",
    )
    commands.add_parser("contracts", help="the CrossHair gate: every contract and twin pair")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvsched` console command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        delegated = _delegated(arguments)
        if delegated is not None:  # options and values go on to the command's own parser, in order
            return _delegate(*delegated)
        args = build_parser().parse_args(arguments)
        result: int = args.run(args)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    except Exception:  # kvsched itself failed: not a verdict on what was checked, so never 1
        traceback.print_exc()
        print("kvsched: the command failed with the error above; no verdict (exit status 2)", file=sys.stderr)
        return 2
    return result


def _version() -> str:
    try:
        return version("kvsched")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
