"""`kvsched bench thrash`: how much the engine recomputes under KV pressure, by admission policy.

The trace (seeded, the same on every machine): 200 requests, prompts of 1 to 3,000 tokens, 1 to
64 new tokens, 3 priorities, all submitted at once; the null model; page size 16, every other
setting `EngineConfig`'s default. For each pool size and each admission policy (`whole_prompt`,
the default, and `first_chunk`) impl's engine runs the trace to the end and reports tokens computed
÷ tokens needed (a prompt's tokens and every generated token but the last, once each: what a run
with no preemption computes), the preemptions, the steps, and the throughput: tokens needed ÷
steps (the useful work of a step; recomputed tokens are not useful). Every request must
finish with the tokens it generates alone (the bench fails loudly otherwise).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvsched import impl
from kvsched.report import CommandParser, measurement, print_table, write_json
from kvsched.spec.engine_config import ADMISSIONS, EngineConfig, EngineRequest
from kvsched.spec.sequence import FinishReason

PAGE_SIZE = 16
POOLS = (256, 512, 1024)
TARGET_RATIO = 1.5  # tokens computed ÷ needed at 256 pages, default policy


def trace(seed: int = 0, requests: int = 200) -> list[EngineRequest]:
    """The thrash trace: long random prompts, short outputs, three priorities."""
    rng = random.Random(seed)
    made = []
    for request_id in range(1, requests + 1):
        prompt = tuple(rng.randrange(50) for _ in range(rng.randint(1, 3000)))
        made.append(EngineRequest(request_id, prompt, rng.randint(1, 64), priority=rng.randrange(3)))
    return made


@dataclass(frozen=True, slots=True)
class Run:
    """One policy on one pool: what the engine computed against what the trace needs."""

    pages: int
    admission: str
    computed: int
    needed: int
    preemptions: int
    steps: int
    seconds: float

    @property
    def ratio(self) -> float:
        return self.computed / self.needed

    def row(self) -> dict[str, Any]:
        return {
            "pages": self.pages,
            "admission": self.admission,
            "computed_over_needed": round(self.ratio, 3),
            "computed": self.computed,
            "needed": self.needed,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "needed_per_step": round(self.needed / self.steps, 1),
            "seconds": round(self.seconds, 2),
        }


def run(pages: int, admission: str, requests: list[EngineRequest]) -> Run:
    """The trace on impl's engine with `pages` pages under `admission`, to the end."""
    engine = impl.Engine(EngineConfig(pages=pages, page_size=PAGE_SIZE, admission=admission), impl.NullModel(50))
    for request in requests:
        engine.submit(request)
    computed = preemptions = steps = 0
    finished: dict[int, FinishReason] = {}
    started = time.perf_counter()
    while engine.has_work():
        output = engine.step()
        computed += output.tokens_run
        preemptions += len(output.preempted)
        finished.update(output.finished)
        steps += 1
    seconds = time.perf_counter() - started
    if len(finished) != len(requests) or set(finished.values()) != {FinishReason.MAX_LENGTH}:
        raise AssertionError(f"the trace did not finish as it must: {len(finished)} of {len(requests)} finished")
    needed = sum(len(request.prompt) + request.max_new_tokens - 1 for request in requests)
    return Run(pages, admission, computed, needed, preemptions, steps, seconds)


HEADER = ("pages", "admission", "computed/needed", "preemptions", "steps", "needed/step")


def cells(row: dict[str, Any]) -> list[object]:
    """One row's table cells."""
    ratio, steps, per_step = row["computed_over_needed"], row["steps"], row["needed_per_step"]
    return [
        row["pages"],
        row["admission"],
        f"{ratio:.3f}x",
        f"{row['preemptions']:,}",
        f"{steps:,}",
        f"{per_step:,.1f}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run every pool under every policy; print the table (or the JSON); 0, or 1 with `--strict`
    when the default policy recomputes more than the target at the smallest pool."""
    parser = CommandParser(prog="kvsched bench thrash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["kvsched bench thrash", *(argv if argv is not None else sys.argv[1:])]))
    requests = trace()
    rows = []
    for pages in POOLS:
        for admission in ADMISSIONS:
            print(f"[bench thrash] {pages} pages, {admission} ...", file=sys.stderr, flush=True)
            rows.append(run(pages, admission, requests).row())
    default = next(row for row in rows if row["pages"] == POOLS[0] and row["admission"] == ADMISSIONS[0])
    verdict = {"target_ratio": TARGET_RATIO, "ratio": default["computed_over_needed"]}
    verdict["met"] = verdict["ratio"] <= TARGET_RATIO
    if args.json:
        write_json(args.json, {"measured": measured, "page_size": PAGE_SIZE, "rows": rows, "verdict": verdict})
    if args.json != "-":
        print_table([cells(row) for row in rows], HEADER)
    return 1 if args.strict and not verdict["met"] else 0


if __name__ == "__main__":
    sys.exit(main())
