"""`kvsched bench engine`: the engine's `step()` with the null model, spec and impl in one run.

Workloads (page size 16, 512-token prompts; W3 of the peer benchmarks):
- steady decode, for R running requests: every request prefilled and decoding, then `step()`
  timed over many steps (each step decodes R tokens and appends them);
- mixed, for R: R - 1 requests decoding and one new 512-token request admitted in the timed
  step, prefilled in one chunk (each timed step is a decode round plus an admission and a
  512-token prefill; the newcomer is cancelled between steps, untimed).
- W2 (the peer benchmarks' shared prefix): 256 requests whose prompts are one 1024-token prefix
  plus 128 unique tokens. The first runs alone; then the other 255 are submitted and stepped
  until done (each generates one token), timed: microseconds per admitted request, submit and
  hashing included. Three ways: the automatic prefix cache with SHA-256 keys, with xxh3-128
  keys, and the named prefix (the first request publishes it, the others name it).

- scale (impl alone): R = 256 and 1,024 requests decoding over a pool sized to fit them and over
  131,072 pages (an H200-sized pool), prefix caching on: µs per steady step, and the memory the
  engine holds (traced by tracemalloc, in a second, untimed build).

The spec is slow, so it times fewer steps; figures are microseconds per step. After each
workload the two engines' abstract states are compared: the bench fails loudly if they differ.
Progress goes to stderr; the table and the JSON to stdout.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvsched import impl, spec
from kvsched.report import CommandParser, measurement, print_table, write_json
from kvsched.spec.engine_config import EngineConfig, EngineRequest

PAGE_SIZE = 16
STEP_TARGET_US = 150.0  # impl step() at 256 in steady decode
SPEEDUP_TARGET = 20.0  # impl over spec
VLLM_STEP_US = 2900.0  # vLLM v1 schedule() + update_from_output() at 256, the peer benchmark's W3


@dataclass(frozen=True, slots=True)
class Plan:
    """The sizes of one engine bench run."""

    requests: tuple[int, ...] = (64, 128, 256)
    prompt_tokens: int = 512
    impl_steps: int = 200
    spec_steps: int = 3
    repeat: int = 3


QUICK = Plan(requests=(8, 16), prompt_tokens=64, impl_steps=20, spec_steps=2, repeat=1)


def _log(message: str) -> None:
    print(f"[bench engine] {message}", file=sys.stderr, flush=True)


def config_for(requests: int, plan: Plan) -> EngineConfig:
    """An engine holding `requests` decoding requests (and one newcomer) for the whole run."""
    tokens = plan.prompt_tokens * 2 + plan.impl_steps * (plan.repeat + 1) + 16
    logical = -(-tokens // PAGE_SIZE)
    return EngineConfig(
        requests=requests + 1,
        pages=(requests + 1) * logical,
        page_size=PAGE_SIZE,
        logical_pages=logical,
        max_batch_size=requests + 1,
        max_batched_tokens=max(requests + 1 + plan.prompt_tokens, 8 * plan.prompt_tokens),
        chunk_size=plan.prompt_tokens,
        prefill_reserve_pages=0,
        max_queue=requests + 1,
        max_seq_len=logical * PAGE_SIZE,
    )


def prompt(request_id: int, tokens: int) -> tuple[int, ...]:
    return tuple((request_id * 131 + position * 7) % 32000 for position in range(tokens))


def decoding_engine(flavour: Any, requests: int, plan: Plan) -> Any:
    """An engine of `flavour` with `requests` requests all prefilled and decoding."""
    config = config_for(requests, plan)
    engine = flavour.Engine(config, flavour.NullModel())
    limit = config.max_seq_len - plan.prompt_tokens - plan.prompt_tokens
    for request_id in range(1, requests + 1):
        engine.submit(EngineRequest(request_id, prompt(request_id, plan.prompt_tokens), limit))
    while len(engine.to_spec().running) < requests or any(not e.decoding for e in engine.to_spec().running):
        engine.step()
    return engine


def time_steps(engine: Any, steps: int, newcomer: bool, prompt_tokens: int) -> float:
    """Mean microseconds of CPU time per `step()` over `steps` steps (with a fresh newcomer each,
    if asked)."""
    total = 0.0
    gc.collect()
    gc.disable()  # a collection inside a timed step would be charged to it
    try:
        for index in range(steps):
            if newcomer:
                engine.submit(EngineRequest(10**6 + index, prompt(index, prompt_tokens), 4))
            start = time.thread_time()  # this thread's CPU time: other work on the machine is not counted
            engine.step()
            total += time.thread_time() - start
            if newcomer:
                engine.cancel(10**6 + index)
    finally:
        gc.enable()
    return 1e6 * total / steps


def bench(requests: int, plan: Plan, mixed: bool) -> dict[str, Any]:
    """One workload row: spec and impl µs per step, best of `plan.repeat` runs for impl."""
    _log(f"{'mixed' if mixed else 'steady decode'} R={requests}: warming both engines")
    engines = {"spec": decoding_engine(spec, requests, plan), "impl": decoding_engine(impl, requests, plan)}
    if engines["spec"].to_spec() != engines["impl"].to_spec():
        raise AssertionError("spec and impl engines disagree after warming up")
    impl_us = min(time_steps(engines["impl"], plan.impl_steps, mixed, plan.prompt_tokens) for _ in range(plan.repeat))
    _log(f"  impl {impl_us:,.1f} us per step; spec {plan.spec_steps} steps")
    spec_us = time_steps(engines["spec"], plan.spec_steps, mixed, plan.prompt_tokens)
    return {
        "workload": "mixed" if mixed else "steady decode",
        "requests": requests,
        "spec_us": spec_us,
        "impl_us": impl_us,
        "speedup": spec_us / impl_us,
    }


W2_PREFIX, W2_UNIQUE, W2_REQUESTS = 1024, 128, 256
W2_TARGET_US = 20.0  # per admitted request, hashing included
W2_MODES = ("cache sha256", "cache xxh3_128", "named prefix")


def w2_requests(count: int, named: spec.PrefixIdentity | None) -> list[EngineRequest]:
    """W2's requests: the shared prefix, then each one's unique tokens."""
    prefix = prompt(0, W2_PREFIX)
    return [
        EngineRequest(index + 1, prefix + prompt(index + 1, W2_UNIQUE), 2 if index == 0 else 1, prefix=named)
        for index in range(count)
    ]


def w2_config(count: int, mode: str) -> EngineConfig:
    """An engine that holds W2 without eviction, admitting 16 requests' suffixes per step."""
    tokens = W2_PREFIX + W2_UNIQUE + 16
    logical = -(-tokens // PAGE_SIZE)
    return EngineConfig(
        requests=count,
        pages=W2_PREFIX // PAGE_SIZE + count * (logical - W2_PREFIX // PAGE_SIZE + 1),
        page_size=PAGE_SIZE,
        logical_pages=logical,
        max_batch_size=count,
        max_batched_tokens=16 * W2_UNIQUE,
        chunk_size=W2_PREFIX + W2_UNIQUE,
        prefill_reserve_pages=0,
        max_queue=count,
        max_seq_len=logical * PAGE_SIZE,
        prefix_entries=1 if mode == "named prefix" else 0,
        prefix_caching=mode != "named prefix",
        page_hash=mode.removeprefix("cache ") if mode != "named prefix" else "sha256",
    )


def run_w2(flavour: Any, count: int, mode: str) -> tuple[float, Any]:
    """W2 on an engine of `flavour`: microseconds per admitted request after the first, and the
    engine (for its cache counters and state)."""
    named = spec.PrefixIdentity((2, 0, 2, 4)) if mode == "named prefix" else None
    first, *rest = w2_requests(count, named)
    engine = flavour.Engine(w2_config(count, mode), flavour.NullModel())
    engine.submit(replace(first, prefix=None))
    engine.step()  # the first request's prompt is computed (and, cached, its full pages are)
    if named is not None:
        engine.publish(first.request_id, W2_PREFIX, named)
    while engine.has_work():
        engine.step()
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        for request in rest:
            engine.submit(request)
        while engine.has_work():
            engine.step()
        elapsed = time.thread_time() - start
    finally:
        gc.enable()
    return 1e6 * elapsed / len(rest), engine


def bench_w2(plan: Plan) -> list[dict[str, Any]]:
    """W2 rows: the spec once and impl best of `plan.repeat`, on all 256 requests (the two
    engines' states compared after the run), and the cache's hit tokens."""
    count = W2_REQUESTS if plan.requests[-1] >= 256 else 16
    rows = []
    for mode in W2_MODES:
        _log(f"W2 {mode}: {count} requests, spec once, impl best of {plan.repeat}")
        spec_us, spec_engine = run_w2(spec, count, mode)
        runs = [run_w2(impl, count, mode) for _ in range(plan.repeat)]
        if spec_engine.to_spec() != runs[0][1].to_spec():
            raise AssertionError(f"W2 {mode}: spec and impl engines disagree")
        impl_us = min(us for us, _ in runs)
        stats = runs[0][1].to_spec().system.cache.stats
        hit = stats.hit_tokens / stats.query_tokens if stats.query_tokens else None
        _log(f"  impl {impl_us:,.1f} us, spec {spec_us:,.1f} us per admitted request")
        rows.append(
            {
                "workload": f"W2 {mode}",
                "requests": count,
                "spec_us": spec_us,
                "impl_us": impl_us,
                "speedup": spec_us / impl_us,
                "hit_tokens": hit,
            }
        )
    return rows


SCALE_POOL = 131_072  # pages: an H200-sized pool
SCALE_REQUESTS = (256, 1024)
SCALE_PROMPT, SCALE_LOGICAL = 128, 64


def scale_engine(requests: int, pages: int) -> Any:
    """impl's engine with `requests` requests of a 128-token prompt decoding, prefix caching on."""
    config = EngineConfig(
        requests=requests,
        pages=pages,
        page_size=PAGE_SIZE,
        logical_pages=SCALE_LOGICAL,
        max_batch_size=requests,
        max_batched_tokens=max(requests, 8192),
        chunk_size=512,
        prefill_reserve_pages=0,
        max_queue=requests,
        max_seq_len=SCALE_LOGICAL * PAGE_SIZE,
        prefix_caching=True,
    )
    engine = impl.Engine(config, impl.NullModel())
    for request_id in range(1, requests + 1):
        engine.submit(EngineRequest(request_id, prompt(request_id, SCALE_PROMPT), config.max_seq_len - SCALE_PROMPT))
    while any(not entry.decoding for entry in engine.to_spec().running) or engine.to_spec().queue:
        engine.step()
    return engine


def bench_scale(steps: int) -> list[dict[str, Any]]:
    """Scale rows: each R over a pool that just fits it and over `SCALE_POOL` pages."""
    rows = []
    for requests in SCALE_REQUESTS:
        for pages in (requests * SCALE_LOGICAL, SCALE_POOL):
            _log(f"scale R={requests} over {pages:,} pages")
            step_us = min(time_steps(scale_engine(requests, pages), steps, False, 0) for _ in range(2))
            tracemalloc.start()
            engine = scale_engine(requests, pages)
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del engine
            rows.append({"requests": requests, "pages": pages, "impl_us": step_us, "memory_mib": held / 2**20})
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steady = [row for row in rows if row["workload"] == "steady decode"]
    at_256 = [row["impl_us"] for row in steady if row["requests"] == 256]
    return {
        "step_target_us": STEP_TARGET_US,
        "impl_step_us_at_256": at_256[0] if at_256 else None,
        "step_met": at_256[0] <= STEP_TARGET_US if at_256 else None,
        "speedup_target": SPEEDUP_TARGET,
        "min_speedup": min(row["speedup"] for row in rows),
        "speedup_met": min(row["speedup"] for row in rows) >= SPEEDUP_TARGET,
        "vllm_step_us_at_256": VLLM_STEP_US,
        "vllm_over_impl_at_256": VLLM_STEP_US / at_256[0] if at_256 else None,
        "w2_target_us": W2_TARGET_US,
        "w2_impl_us": {row["workload"]: row["impl_us"] for row in rows if row["workload"].startswith("W2")},
        "w2_hit_tokens": {row["workload"]: row["hit_tokens"] for row in rows if row.get("hit_tokens") is not None},
    }


def table(rows: list[dict[str, Any]]) -> str:
    header = f"{'workload':<20}{'R':>5}{'spec':>16}{'impl':>14}{'speedup':>10}{'hit tokens':>12}"
    lines = [header, "-" * len(header)]
    for row in rows:
        hit = row.get("hit_tokens")
        lines.append(
            f"{row['workload']:<20}{row['requests']:>5}{row['spec_us']:>13,.1f} us"
            f"{row['impl_us']:>11,.1f} us{row['speedup']:>9,.1f}x{'' if hit is None else f'{hit:>11.1%}'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the engine bench; print the table (or the JSON); 0, or 1 with `--strict` on a miss."""
    parser = CommandParser(prog="kvsched bench engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run (seconds)")
    parser.add_argument(
        "--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout, instead of the table)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["kvsched bench engine", *(argv if argv is not None else sys.argv[1:])]))
    plan = QUICK if args.quick else Plan()
    _log("compiling kernels (an untimed run of both workloads)")
    warm = replace(QUICK, requests=(4,), impl_steps=4, spec_steps=1)
    bench(4, warm, mixed=False)
    bench(4, warm, mixed=True)
    for mode in W2_MODES:
        run_w2(impl, 2, mode)
    rows = [bench(requests, plan, mixed=False) for requests in plan.requests]
    rows.append(bench(plan.requests[-1], plan, mixed=True))
    rows += bench_w2(plan)
    scale = bench_scale(plan.impl_steps // 4 if args.quick else plan.impl_steps)
    result = verdict(rows)
    report = {"measured": measured, "plan": asdict(plan), "page_size": PAGE_SIZE, "rows": rows, "verdict": result}
    report["scale"] = scale
    if args.json:
        write_json(args.json, report)
    if args.json != "-":
        print(table(rows))
        print_table(
            [
                [row["requests"], f"{row['pages']:,}", f"{row['impl_us']:,.1f} us", f"{row['memory_mib']:,.1f} MiB"]
                for row in scale
            ],
            ["scale: R", "pages", "impl step", "engine memory"],
        )
    missed = result["step_met"] is False or not result["speedup_met"]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
