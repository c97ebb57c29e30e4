"""Record SGLang's answers to the harness, for CI to replay without SGLang (`make sglang`).

For each shipped adapter, `--programs` seeded random programs of the harness's calls (the
campaign's prompts and verbs), each run over `Recorder(adapter)`: every one must pass. For each
broken variant, its pinned program: it must fail with the check the variant names. Each trace
is written under OUT as `<name>.json.gz` (a list of traces: `kvsched.testing.adapters.recorded`).

    python -m devtools.sglang.record_traces OUT [--programs 40] [--steps 30]   (SGLang's venv)
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvsched.testing.adapter import PageManager
from kvsched.testing.adapters import sglang
from kvsched.testing.adapters.recorded import Recorder
from kvsched.testing.checks import CheckFailed
from kvsched.testing.safety import VOCABULARY, SafetyMachine
from kvsched.testing.safety_search import MAX_TOKENS, prompt_starts

ADAPTERS = (
    ("radix_token", sglang.radix_token, 1),
    ("radix_paged", sglang.radix_paged, 2),
    ("unified_token", sglang.unified_token, 1),
    ("unified_paged", sglang.unified_paged, 2),
    ("unified_rust_token", sglang.unified_rust_token, 1),
    ("unified_rust_paged", sglang.unified_rust_paged, 2),
)


def random_program(machine: SafetyMachine, rng: random.Random, steps: int) -> None:
    """The campaign's verbs, drawn from `rng`, on requests 1..5."""
    starts = prompt_starts(machine.page_size)
    for _ in range(steps):
        verb, request_id = (
            rng.choice(("submit", "submit", "decode", "decode_all", "finish", "preempt", "resume", "reset")),
            rng.randint(1, 5),
        )
        known = request_id in machine.sequences or request_id in machine.preempted
        if verb == "submit" and not known:
            start = rng.choice(starts)[: rng.randint(0, 3 * machine.page_size)]
            extra = tuple(rng.randint(0, VOCABULARY - 1) for _ in range(rng.randint(0, machine.page_size)))
            machine.submit(request_id, (start + extra) or (0,))
        elif verb == "decode" and 0 < len(machine.sequences.get(request_id, ())) < MAX_TOKENS:
            machine.decode(request_id)
        elif verb == "decode_all":
            for live in sorted(machine.sequences):
                if len(machine.sequences[live]) < MAX_TOKENS:
                    machine.decode(live)
        elif verb in ("finish", "preempt") and request_id in machine.sequences:
            getattr(machine, verb)(request_id)
        elif verb == "resume" and request_id in machine.preempted:
            machine.resume(request_id)
        elif verb == "reset":
            machine.reset_cache()
    machine.teardown()


def record(
    name: str,
    factory: Callable[[int, int], PageManager],
    pages: int,
    page_size: int,
    body: Callable[[SafetyMachine], None],
) -> dict[str, Any]:
    recorders: list[Recorder] = []

    def recorded(pages: int, page_size: int) -> Recorder:
        recorders.append(Recorder(factory(pages, page_size)))
        return recorders[-1]

    machine = SafetyMachine(recorded, pages, page_size, check=False)
    verdict = "pass"
    try:
        machine.check_start()
        body(machine)
    except CheckFailed as failure:
        verdict = failure.failure.kind.name
    return {
        "factory": name,
        "pages": pages,
        "page_size": page_size,
        "capabilities": sorted(machine.capabilities),
        "program": machine.program,
        "verdict": verdict,
        "calls": recorders[0].calls,
    }


def write(path: Path, traces: list[dict[str, Any]]) -> None:
    """The traces as gzipped JSON (no timestamp: the same traces, the same file)."""
    path.write_bytes(gzip.compress((json.dumps(traces) + "\n").encode(), mtime=0))


def main(argv: list[str] | None = None) -> int:
    from devtools.sglang.variants import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for name, factory, page_size in ADAPTERS:
        traces = []
        for number in range(args.programs):
            rng = random.Random(number)
            pages = rng.choice((4, 6, 8, 16))
            program = functools.partial(random_program, rng=rng, steps=args.steps)
            traces.append(record(name, factory, pages, page_size, program))
        failed = [trace for trace in traces if trace["verdict"] != "pass"]
        ok &= not failed
        calls = sum(len(trace["calls"]) for trace in traces)
        print(f"{name}: {len(traces)} programs, {calls} calls recorded, {len(failed)} failed", file=sys.stderr)
        for trace in failed:
            print(f"  {trace['verdict']}: " + "; ".join(trace["program"]), file=sys.stderr)
        write(args.out / f"{name}.json.gz", traces)
    for variant in VARIANTS:

        def pinned(machine: SafetyMachine, lines: tuple[str, ...] = variant.program) -> None:
            for line in lines:
                exec(line, {"machine": machine})  # the variant's pinned program

        trace = record(variant.name, variant.factory, 8, variant.page_size, pinned)
        caught = trace["verdict"] == variant.caught_by.name
        ok &= caught
        print(f"{variant.name}: pinned program {trace['verdict']} (expected {variant.caught_by.name})", file=sys.stderr)
        write(args.out / f"{variant.name}.json.gz", [trace])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
