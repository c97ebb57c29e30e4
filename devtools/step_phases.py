"""Where impl's steady decode step spends its time: the peer benchmarks' W3 (R requests of 512
prompt tokens, 128 new, prefix caching on, SHA-256 page keys) through `kvsched.impl.Engine` with
its null model, each phase of a step that only decodes timed by the thread's CPU time.

    python -m devtools.step_phases [--requests 128 256] [--runs 3] [--json docs/bench/step-phases.json]

A step that only decodes is the engine's plan (its room: `prepare_decode_round`; the round lowered), the
model's call and its answers applied, the commit (`commit_round`: tokens appended, filled pages
and finished requests noted; the filled pages keyed and cached; the end-of-step eviction) and its
output. Each phase is timed by wrapping its method for the run (the engine's code is not
changed); "the rest" is the step less its phases (its own glue: the cache's settle, the counters,
choosing the decode-only path), and the step is also timed bare, in a run without the wrappers,
so the wrappers' own cost is the difference. Only the steady steps count: every request decoded
one token and none finished.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from kvsched.impl import Engine, NullModel
from kvsched.impl.engine_batch import Batch
from kvsched.impl.engine_cache import CachePolicy
from kvsched.report import measurement, write_json
from kvsched.spec.engine_config import EngineConfig, EngineRequest

PAGE, PROMPT, NEW = 16, 512, 128
OUT = Path(__file__).resolve().parents[1] / "docs" / "bench" / "step-phases.json"

# (phase, the class whose method is timed, the method); in the order a step runs them
PHASES: tuple[tuple[str, type, str], ...] = (
    ("plan: room (prepare_decode_round)", Batch, "room"),
    ("plan: lower the round", Batch, "lower"),
    ("model: the null model's round", NullModel, "execute_ragged"),
    ("model: the call, its answers applied", Batch, "run_model"),
    ("commit: tokens appended (commit_round)", Batch, "commit_round"),
    ("commit: filled pages keyed and cached", CachePolicy, "publish_written"),
    ("commit: end-of-step eviction", CachePolicy, "evict"),
    ("output: StepOutput", Engine, "_output"),
)
CLOCK = time.thread_time_ns


def config(requests: int) -> EngineConfig:
    """The peer benchmarks' W3 as the engine's configuration (`kvsched_driver.w3_config`)."""
    return EngineConfig(
        requests=requests,
        pages=requests * -(-(PROMPT + NEW + 1) // PAGE) + 64,
        page_size=PAGE,
        logical_pages=2048 // PAGE,
        max_batch_size=requests,
        max_batched_tokens=8192,
        chunk_size=2048,
        prefill_reserve_pages=0,
        max_queue=requests,
        max_seq_len=2048,
        prefix_caching=True,
        page_hash="sha256",
    )


@contextmanager
def timed(spent: dict[str, int]) -> Iterator[None]:
    """Every phase's method wrapped to add its thread CPU time to `spent` (restored after)."""
    saved = [(owner, name, owner.__dict__[name]) for _, owner, name in PHASES]

    def wrap(label: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed_method(*args: Any, **kwargs: Any) -> Any:
            start = CLOCK()
            try:
                return method(*args, **kwargs)
            finally:
                spent[label] += CLOCK() - start

        return timed_method

    try:
        for label, owner, name in PHASES:
            setattr(owner, name, wrap(label, owner.__dict__[name]))
        yield
    finally:
        for owner, name, method in saved:
            setattr(owner, name, method)


def run(requests: int, phases: bool) -> tuple[int, int, dict[str, int]]:
    """One W3 run: the steady steps, their thread CPU time in ns, and each phase's (with `phases`)."""
    engine = Engine(config(requests), NullModel())
    prompts = [EngineRequest(i + 1, tuple(range(i * PROMPT + 1, (i + 1) * PROMPT + 1)), NEW) for i in range(requests)]
    spent = {label: 0 for label, _, _ in PHASES}
    steady = total = 0
    with timed(spent) if phases else nullcontext():
        for request in prompts:
            engine.submit(request)
        while engine.has_work():
            before = dict(spent)
            start = CLOCK()
            output = engine.step()
            elapsed = CLOCK() - start
            if output.tokens_run == requests and len(output.tokens) == requests and not output.finished:
                steady, total = steady + 1, total + elapsed
            else:
                spent.update(before)  # a step that prefilled or finished is not counted
    return steady, total, spent


def measure(requests: int, runs: int) -> dict[str, Any]:
    """The phases of `runs` runs and the bare step of as many, µs per steady step."""
    bare = [run(requests, phases=False) for _ in range(runs)]
    timed_runs = [run(requests, phases=True) for _ in range(runs)]
    steps = sum(steady for steady, _, _ in timed_runs)
    per_step = {label: sum(spent[label] for _, _, spent in timed_runs) / steps / 1000 for label, _, _ in PHASES}
    model = per_step["model: the null model's round"]
    per_step["model: the call, its answers applied"] -= model  # run_model's own time, the model apart
    step = sum(total for _, total, _ in timed_runs) / steps / 1000
    per_step["the rest of step()"] = step - sum(per_step.values())
    return {
        "requests": requests,
        "steady_steps": steps // runs,
        "runs": runs,
        "step_us": sum(total for _, total, _ in bare) / sum(steady for steady, _, _ in bare) / 1000,
        "step_timed_us": step,
        "phases_us": per_step,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.step_phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=OUT, help="where the report goes ('-': stdout)")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["python -m devtools.step_phases", *(sys.argv[1:] if argv is None else argv)]))
    rows = []
    for requests in args.requests:
        row = measure(requests, args.runs)
        rows.append(row)
        print(f"R={requests}: {row['step_us']:.1f} us a steady step ({row['step_timed_us']:.1f} timed by phase)")
        for label, value in row["phases_us"].items():
            print(f"  {label:42s} {value:6.1f} us")
    write_json(str(args.json), {"measured": measured, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
