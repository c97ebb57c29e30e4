"""`kvsched mutants`: run the stateful harness on every deliberately broken impl variant.

Each mutant of `devtools.mutants_corpus` replaces one impl class by a subclass with one
bug; the harness (`KvschedMachine`, in lockstep with the spec) runs it with a fixed seed for a
bounded number of examples and must fail. The table says, per mutant, which check caught it
(the failure's `FailureKind`: lockstep, atomicity, LIFO order, an invariant, a ghost read,
the exclusive-write postcondition, liveness, an untyped error), after how many examples and
seconds. A control row runs the unmodified impl the same
way (same seed, same examples) and must pass, and every failure is replayed on the unmodified
impl, which must pass it: a catch the harness would also make on correct code is no catch. The
command exits 1 if the control fails or any mutant survives.

The system under test hands the round its scratch buffers the way an engine does: views of
buffers kept across rounds (`ReusedScratchAdapter`), so stale data from the previous round is
there for a round that forgets to clear it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from hypothesis import seed
from hypothesis.stateful import get_state_machine_test

from devtools.mutants_corpus import COMPONENTS, MUTANTS, Mutant
from kvsched.abi import empty_items, empty_outputs
from kvsched.impl.system import ImplSystem
from kvsched.testing.bounded import bounded
from kvsched.testing.campaign import program_namespace
from kvsched.testing.checks import CheckFailed
from kvsched.testing.impl_system import ImplAdapter
from kvsched.testing.machine import CampaignStats, KvschedMachine
from kvsched.testing.system import SystemConfig, SystemFactory, SystemUnderTest, spec_system

CONFIG = SystemConfig(max_references=3)  # a low maximum, so reference overflows are reachable
CONTROL = "impl, unmodified (control)"


class ReusedScratchAdapter(ImplAdapter):
    """impl behind the harness, with round scratch that persists between rounds (as an
    engine's does): `scratch` returns views of buffers that only ever grow."""

    def __init__(self, system: ImplSystem) -> None:
        super().__init__(system)
        self._items = empty_items(0)
        self._tables = np.zeros(0, dtype=np.uint32)
        self._outputs = empty_outputs(0)

    def scratch(self, items: int, tables: int, outputs: int) -> tuple[Any, Any, Any]:
        self._items = _grown(self._items, items)
        self._tables = _grown(self._tables, tables)
        self._outputs = _grown(self._outputs, outputs)
        return self._items[:items], self._tables[:tables], self._outputs[:outputs]


def _grown(buffer: Any, length: int) -> Any:
    if buffer.shape[0] >= length:
        return buffer
    grown = np.zeros(length, dtype=buffer.dtype)
    grown[: buffer.shape[0]] = buffer  # keep the stale contents
    return grown


def mutant_system(mutant: Mutant | None) -> SystemFactory:
    """A factory of impl systems with `mutant`'s class in place of the real one (None: none)."""
    classes = dict(COMPONENTS)
    if mutant is not None:
        classes[mutant.component] = mutant.build()

    def build(config: SystemConfig) -> SystemUnderTest:
        pool = classes["pool"](config.physical_pages, max_references=config.max_references)
        store = classes["store"](config.store_entries, config.store_pages, pool=pool)
        scheduler = classes["scheduler"](
            config.requests, config.logical_pages, pool=pool, prefixes=store, page_size=config.page_size
        )
        return ReusedScratchAdapter(ImplSystem(pool, store, scheduler))

    return build


@dataclass(frozen=True, slots=True)
class Verdict:
    """One harness run: caught or not, by which check, after how much work."""

    mutant: str
    caught: bool
    checker: str
    examples: int
    steps: int
    seconds: float
    failure: str


def classify(error: BaseException) -> str:
    """The check that raised `error`: its failure's kind, or the type of an error no check raised."""
    if isinstance(error, CheckFailed):
        return error.failure.kind.value
    return f"error: {type(error).__name__}"


def hunt(
    name: str,
    factory: SystemFactory,
    *,
    examples: int,
    steps: int,
    random_seed: int,
    control: SystemFactory | None = None,
) -> Verdict:
    """Run the harness on `factory` in lockstep with the spec until it fails or `examples` pass.

    Shrinking is off: the run stops at the first failure (hypothesis replays that one example
    once more to report it, which `examples` does not count). With a `control` factory, a
    failure counts only if the control passes the same program: a program that fails the
    unmodified impl too shows a harness problem, not the mutant's bug.
    """
    stats = CampaignStats()

    def build() -> KvschedMachine:
        return KvschedMachine(factory, spec_system, CONFIG, stats)

    run_settings = bounded(examples, steps, shrink=False, seeded=True)
    machine_factory: Any = build  # hypothesis takes any zero-argument machine factory
    test = seed(random_seed)(get_state_machine_test(machine_factory, settings=run_settings))
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # hypothesis reports the program on stdout too
            test()
    except Exception as error:
        seconds = time.perf_counter() - started
        examples_run = max(stats.examples - 1, 1)
        if control is not None:
            program = program_of(error)
            unmodified = replay(program, control) if program else "no program to replay"
            if unmodified is not None:  # the harness fails the real impl too: not this mutant's bug
                detail = f"the unmodified impl fails the same program ({unmodified})\n{_describe(error)}"
                return Verdict(name, False, "harness (not the bug)", examples_run, stats.steps, seconds, detail)
        return Verdict(name, True, classify(error), examples_run, stats.steps, seconds, _describe(error))
    return Verdict(name, False, "-", stats.examples, stats.steps, time.perf_counter() - started, "")


def program_of(error: BaseException) -> list[str]:
    """The failing program's steps (`state.rule(...)` calls, a long one over several lines)
    from hypothesis's notes."""
    notes = "\n".join(getattr(error, "__notes__", []))
    steps: list[str] = []
    pending = ""
    for line in notes.splitlines():
        if not pending and not line.strip().startswith("state."):
            continue
        pending += line.strip() + "\n"
        try:
            ast.parse(pending)
        except SyntaxError:
            continue  # the call goes on in the next line
        steps.append(pending.strip())
        pending = ""
    return steps


def replay(program: Sequence[str], factory: SystemFactory) -> str | None:
    """Run a failing program on `factory` in lockstep with the spec: the failure, or None."""
    state = KvschedMachine(factory, spec_system, CONFIG)
    namespace = program_namespace()
    try:
        for line in program:
            exec(line, {**namespace, "state": state})  # the harness's own reproduction lines
        if "state.teardown()" not in program:
            state.teardown()
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def _describe(error: BaseException) -> str:
    notes = "\n".join(getattr(error, "__notes__", []))
    return f"{type(error).__name__}: {error}\n{notes}".strip()


def print_table(verdicts: Sequence[Verdict]) -> None:
    """The corpus table."""
    header = ("mutant", "caught", "by", "examples", "steps", "time")
    rows = [
        (v.mutant, "yes" if v.caught else "NO", v.checker, str(v.examples), str(v.steps), f"{v.seconds:.1f}s")
        for v in verdicts
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for index, row in enumerate([header, *rows]):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def run_worker(name: str, examples: int, steps: int, random_seed: int) -> Verdict:
    """Hunt one mutant (or, for `CONTROL`, the unmodified impl) in this process."""
    unmodified = mutant_system(None)
    if name == CONTROL:
        return hunt(CONTROL, unmodified, examples=examples, steps=steps, random_seed=random_seed)
    mutant = next(mutant for mutant in MUTANTS if mutant.name == name)
    factory = mutant_system(mutant)
    return hunt(name, factory, examples=examples, steps=steps, random_seed=random_seed, control=unmodified)


def run_isolated(name: str, args: argparse.Namespace) -> Verdict:
    """Hunt one mutant in a worker process: a mutant that corrupts memory inside a compiled
    kernel (impl trusts its own indexes there) takes down only its worker."""
    command = [sys.executable, "-m", "devtools.mutants", "--worker", name]
    command += ["--examples", str(args.examples), "--steps", str(args.steps), "--seed", str(args.seed)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        verdict = Verdict(**json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        detail = f"worker exited with status {done.returncode}\n{done.stderr[-2000:]}"
        verdict = Verdict(name, False, "worker crashed", 0, 0, time.perf_counter() - started, detail)
    outcome = f"caught by {verdict.checker}" if verdict.caught else f"not caught ({verdict.checker})"
    print(f"{name}: {outcome}, {verdict.examples} examples, {verdict.seconds:.1f}s", file=sys.stderr)
    return verdict


def main(argv: Sequence[str] | None = None) -> int:
    """Run the control and every mutant; 0 when the control passes and every mutant is caught."""
    parser = argparse.ArgumentParser(prog="kvsched mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=400, help="examples per mutant before it survives (400)")
    parser.add_argument("--steps", type=int, default=40, help="operations per example (40)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--only", default="", help="run only mutants whose name contains this text")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (2)")
    parser.add_argument("--verbose", action="store_true", help="print each failure and its program")
    parser.add_argument("--json", help="also write the verdicts as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: hunt one mutant, print its verdict
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments[1:] if arguments[:1] == ["--"] else arguments)  # `kvsched mutants -- ...`
    if args.worker:
        print(json.dumps(asdict(run_worker(args.worker, args.examples, args.steps, args.seed))))
        return 0
    names = [CONTROL] + [mutant.name for mutant in MUTANTS if args.only in mutant.name]
    started = time.perf_counter()
    print(f"{len(names) - 1} mutants and a control, {args.examples} examples each", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        verdicts = list(pool.map(lambda name: run_isolated(name, args), names))
    control, mutants = verdicts[0], verdicts[1:]
    print(f"kvsched mutants: seed {args.seed}, {args.steps} steps per example, lockstep with the spec")
    print_table(verdicts)
    survivors = [verdict.mutant for verdict in mutants if not verdict.caught]
    elapsed = time.perf_counter() - started
    print(f"\n{len(mutants) - len(survivors)} of {len(mutants)} mutants caught in {elapsed:.0f} s")
    if control.caught or control.checker == "worker crashed":
        print(f"\nthe unmodified impl FAILED the harness, so the corpus proves nothing:\n{control.failure}")
    for verdict in mutants:
        if not verdict.caught:
            print(f"SURVIVED: {verdict.mutant} ({verdict.checker})")
    if args.verbose:
        for verdict in mutants:
            print(f"\n== {verdict.mutant}\n{verdict.failure}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([asdict(verdict) for verdict in verdicts], handle, indent=2)
    return 1 if control.caught or control.checker == "worker crashed" or survivors else 0


if __name__ == "__main__":
    sys.exit(main())
