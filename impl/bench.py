"""`kvsched bench`: one workload replayed through the spec and through impl, timed side by side.

Workloads (page size 16):
- decode, for R concurrent requests: admit, prefill a 512-token prompt (one `ensure_writable`
  per page, one `record_token` per token), complete and seed; then 256 decode rounds, each making
  room for every request's next token (a fresh page every 16 tokens) and running one ragged round
  with a no-op backend; then finish every request.
- shared prefix: publish a 1024-token prefix, admit 256 requests attaching it, then each request
  rewrites the prefix's last token (the last prompt token is always recomputed), so its first
  write is a copy-on-write of the shared last page; then finish.
- admission: admit 256 requests, each making room for and counting its 512-token prompt in one
  `record_chunk` (a prefill chunk is one call).

A round is, in impl, `prepare_decode_round` + `execute_decode_round`; in the spec, which has no
batched form, one `ensure_writable` per decoding request + `execute_decode_round`. The spec is
slow, so it replays only the first `--spec-rounds` rounds; figures are per round and per
operation. After the spec's last round both systems are abstracted and compared: the bench
fails loudly if they disagree. Progress goes to stderr; the table and the JSON to stdout.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from kvsched import impl, spec
from kvsched.charts import BarChart, Reference
from kvsched.impl.jit import jit
from kvsched.impl.refinement import abstract_system
from kvsched.report import CommandParser, measurement, write_json
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.system import SystemState

PAGE_SIZE = 16
SPEEDUP_TARGET = 20.0
ROUND_TARGET_US = 50.0
ROUND_TARGET_REQUESTS = 256


@dataclass(frozen=True, slots=True)
class Plan:
    """The sizes of one bench run."""

    requests: tuple[int, ...] = (32, 128, 256)
    prompt_tokens: int = 512
    rounds: int = 256
    spec_rounds: int = 16
    prefix_requests: int = 256
    prefix_tokens: int = 1024


QUICK = Plan(requests=(8, 32), prompt_tokens=64, rounds=32, spec_rounds=4, prefix_requests=32, prefix_tokens=128)


@dataclass(slots=True)
class Timings:
    """Total seconds and counts per operation, for one system."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def measure(self, operation: str, count: int) -> Iterator[None]:
        gc.collect()
        start = time.perf_counter()
        yield
        self.seconds[operation] = self.seconds.get(operation, 0.0) + time.perf_counter() - start
        self.counts[operation] = self.counts.get(operation, 0) + count

    def per_call_us(self, operation: str) -> float:
        """Mean microseconds per call."""
        return 1e6 * self.seconds[operation] / self.counts[operation]


@jit
def _echo(items: Any, out: Any) -> None:
    for index in range(items.shape[0]):
        out[index]["request_id"] = items[index]["request_id"]
        out[index]["slot"] = items[index]["slot"]
        out[index]["next_token_id"] = items[index]["token_id"] + 1


class ArrayEcho:
    """The no-op model for impl's structured arrays: answers every item with token + 1."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        _echo(items, out)
        return RaggedBatchReceipt(items.shape[0], 1, items.shape[0] * RaggedBatchOutput.SIZE)


class RecordEcho:
    """The same no-op model for the spec's record lists."""

    def execute_ragged(
        self, items: Sequence[RaggedBatchItem], block_tables: Sequence[int], out: MutableSequence[RaggedBatchOutput]
    ) -> RaggedBatchReceipt:
        for index, item in enumerate(items):
            out[index] = RaggedBatchOutput(item.request_id, item.slot, (item.token_id + 1) & 0xFFFFFFFF)
        return RaggedBatchReceipt(len(items), 1, len(items) * RaggedBatchOutput.SIZE)


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _spec_round(scheduler: spec.RequestScheduler, pool: spec.BlockPool, scratch: tuple[Any, Any, Any]) -> None:
    for slot in scheduler.state.slots:
        if slot.state is spec.RequestState.DECODE:
            scheduler.ensure_writable(slot.request_id, slot.token_count // PAGE_SIZE, pool)
    scheduler.execute_decode_round(RecordEcho(), *scratch)


def _impl_round(scheduler: impl.RequestScheduler, pool: impl.BlockPool, backend: ArrayEcho) -> None:
    scheduler.prepare_decode_round(pool, PAGE_SIZE)
    scheduler.execute_decode_round(backend)


def _decode_setup(module: Any, requests: int, plan: Plan, timings: Timings) -> tuple[Any, Any, Any]:
    prompt_pages = plan.prompt_tokens // PAGE_SIZE
    logical_pages = -(-(plan.prompt_tokens + plan.rounds) // PAGE_SIZE)
    pool = module.BlockPool(requests * logical_pages)
    store, scheduler = module.PrefixKvStore(1, 1), module.RequestScheduler(requests, logical_pages, page_size=PAGE_SIZE)
    with timings.measure("admit", requests):
        for request in range(requests):
            scheduler.admit_with_prefix(request, None, store, pool)
    with timings.measure("ensure_writable", requests * prompt_pages):
        for request in range(requests):
            for page in range(prompt_pages):
                scheduler.ensure_writable(request, page, pool)
    with timings.measure("record_token", requests * plan.prompt_tokens):
        for request in range(requests):
            for _ in range(plan.prompt_tokens):
                scheduler.record_token(request)
    with timings.measure("mark_prefill_complete + seed_decode_token", 2 * requests):
        for request in range(requests):
            scheduler.mark_prefill_complete(request)
            scheduler.seed_decode_token(request, request)
    return pool, store, scheduler


def _states(pool: Any, store: Any, scheduler: Any) -> SystemState:
    if isinstance(scheduler, impl.RequestScheduler):
        return abstract_system(pool, store, scheduler)
    return SystemState(pool.state, store.state, scheduler.state)


def bench_decode(requests: int, plan: Plan) -> dict[str, Timings]:
    """The decode workload at `requests` concurrent requests, through both systems."""
    results: dict[str, Timings] = {"spec": Timings(), "impl": Timings()}
    checkpoints: dict[str, SystemState] = {}
    for name, module in (("spec", spec), ("impl", impl)):
        timings = results[name]
        _log(f"decode R={requests} {name}: admit and prefill {plan.prompt_tokens} tokens each")
        pool, store, scheduler = _decode_setup(module, requests, plan, timings)
        rounds = plan.spec_rounds if name == "spec" else plan.rounds
        _log(f"decode R={requests} {name}: {rounds} rounds")
        if name == "spec":
            width = scheduler.logical_pages
            scratch = ([RaggedBatchItem()] * requests, [0] * (requests * width), [RaggedBatchOutput()] * requests)
            with timings.measure("round", rounds):
                for _ in range(rounds):
                    _spec_round(scheduler, pool, scratch)
            checkpoints[name] = _states(pool, store, scheduler)
        else:
            backend = ArrayEcho()
            with timings.measure("round", plan.spec_rounds):
                for _ in range(plan.spec_rounds):
                    _impl_round(scheduler, pool, backend)
            checkpoints[name] = _states(pool, store, scheduler)
            with timings.measure("round", rounds - plan.spec_rounds):
                for _ in range(rounds - plan.spec_rounds):
                    _impl_round(scheduler, pool, backend)
        with timings.measure("finish", requests):
            for request in range(requests):
                scheduler.finish(request, pool)
        assert pool.free_count() == pool.physical_pages, f"{name} leaked pages"
    if checkpoints["spec"] != checkpoints["impl"]:
        raise AssertionError(f"decode R={requests}: spec and impl disagree after {plan.spec_rounds} rounds")
    return results


def bench_shared_prefix(plan: Plan) -> dict[str, Timings]:
    """The shared-prefix workload, through both systems."""
    requests, prefix_pages = plan.prefix_requests, plan.prefix_tokens // PAGE_SIZE
    identity = spec.PrefixIdentity((1, 2, 3, 4))
    last_page = (plan.prefix_tokens - 1) // PAGE_SIZE
    results: dict[str, Timings] = {"spec": Timings(), "impl": Timings()}
    states: dict[str, SystemState] = {}
    for name, module in (("spec", spec), ("impl", impl)):
        timings = results[name]
        _log(f"shared prefix {name}: {requests} requests attach {plan.prefix_tokens} tokens")
        pool = module.BlockPool(prefix_pages + 2 * requests)
        store = module.PrefixKvStore(1, prefix_pages)
        scheduler = module.RequestScheduler(requests, prefix_pages + 1, page_size=PAGE_SIZE)
        pages = tuple(pool.allocate() for _ in range(prefix_pages))
        store.publish(spec.PrefixPageSet(identity, pages, plan.prefix_tokens), pool)
        for page in pages:
            pool.release(page)  # the producer hands its pages to the store
        with timings.measure("admit_with_prefix (hit)", requests):
            for request in range(requests):
                scheduler.admit_with_prefix(request, identity, store, pool)
        with timings.measure("ensure_writable (copy)", requests):
            for request in range(requests):
                scheduler.ensure_writable(request, last_page, pool)
        states[name] = _states(pool, store, scheduler)
        with timings.measure("finish", requests):
            for request in range(requests):
                scheduler.finish(request, pool)
        if name == "impl":  # the batched form of the same copies, on a fresh admission
            for request in range(requests):
                scheduler.admit_with_prefix(request, identity, store, pool)
            with timings.measure("ensure_writable_batch (copy), per request", requests):
                plan_ = scheduler.ensure_writable_batch(np.arange(requests), np.full(requests, last_page), pool)
            assert len(plan_.copy_sources) == requests
    if states["spec"] != states["impl"]:
        raise AssertionError("shared prefix: spec and impl disagree")
    return results


def bench_admission(plan: Plan) -> dict[str, Timings]:
    """Admission as the engine does it with the bulk form: per request, admit, then make room for
    and count the whole prompt in one `record_chunk`."""
    requests, prompt_pages = plan.prefix_requests, plan.prompt_tokens // PAGE_SIZE
    results: dict[str, Timings] = {"spec": Timings(), "impl": Timings()}
    states: dict[str, SystemState] = {}
    for name, module in (("spec", spec), ("impl", impl)):
        timings = results[name]
        _log(f"admission {name}: {requests} requests, {plan.prompt_tokens}-token prompts")
        pool = module.BlockPool(requests * prompt_pages)
        store = module.PrefixKvStore(1, 1, pool=pool)
        scheduler = module.RequestScheduler(requests, prompt_pages, pool=pool, prefixes=store, page_size=PAGE_SIZE)
        with timings.measure(f"admit + make room for + account a {plan.prompt_tokens}-token prompt", requests):
            for request in range(requests):
                scheduler.admit_with_prefix(request, None, store, pool)
                scheduler.record_chunk(request, plan.prompt_tokens, pool)
        states[name] = _states(pool, store, scheduler)
    if states["spec"] != states["impl"]:
        raise AssertionError("admission: spec and impl disagree")
    return results


def _warm_up() -> None:
    """Compile every kernel the timed sections call (numba compiles on first use)."""
    bench_decode(2, Plan(requests=(2,), prompt_tokens=16, rounds=2, spec_rounds=1))
    bench_shared_prefix(Plan(prefix_requests=2, prefix_tokens=32))
    bench_admission(Plan(prefix_requests=2, prompt_tokens=32))


def _best(runs: Sequence[Timings], operation: str) -> float | None:
    """The fastest per-call time over repeated runs (the least disturbed by this machine's noise)."""
    times = [run.per_call_us(operation) for run in runs if operation in run.seconds]
    return min(times) if times else None


def _rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per operation, then one per workload: every operation's best per-call time times
    impl's call count (the spec's rounds extrapolated to impl's), summed."""
    rows = []
    for result in results:
        spec_runs, impl_runs = result["spec"], result["impl"]
        spec_total = impl_total = 0.0
        for operation, calls in impl_runs[0].counts.items():
            spec_us, impl_us = _best(spec_runs, operation), _best(impl_runs, operation)
            assert impl_us is not None
            rows.append(
                {
                    "workload": result["workload"],
                    "requests": result["requests"],
                    "operation": operation,
                    "spec_us": spec_us,
                    "impl_us": impl_us,
                    "speedup": None if spec_us is None else spec_us / impl_us,
                    "spec_calls": spec_runs[0].counts.get(operation, 0),
                    "impl_calls": calls,
                }
            )
            if spec_us is not None:
                spec_total, impl_total = spec_total + spec_us * calls, impl_total + impl_us * calls
        rows.append(
            {
                "workload": result["workload"],
                "requests": result["requests"],
                "operation": "whole workload (spec rounds extrapolated)",
                "spec_us": spec_total,
                "impl_us": impl_total,
                "speedup": spec_total / impl_total,
                "spec_calls": 1,
                "impl_calls": 1,
            }
        )
    return rows


def _verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    whole = [row["speedup"] for row in rows if row["operation"].startswith("whole")]
    rounds = [row for row in rows if row["operation"] == "round"]
    at_target = [row["impl_us"] for row in rounds if row["requests"] == ROUND_TARGET_REQUESTS]
    return {
        "speedup_target": SPEEDUP_TARGET,
        "min_workload_speedup": min(whole),
        "min_round_speedup": min(row["speedup"] for row in rounds),
        "min_operation_speedup": min(row["speedup"] for row in rows if row["speedup"] is not None),
        "speedup_met": min(whole) >= SPEEDUP_TARGET and min(row["speedup"] for row in rounds) >= SPEEDUP_TARGET,
        "round_target_us": ROUND_TARGET_US,
        "round_us_at_256": at_target[0] if at_target else None,
        "round_met": at_target[0] <= ROUND_TARGET_US if at_target else None,
    }


VLLM_ROUND_US = 1360.0  # vLLM v1 KVCacheManager (CPU build), R = 256, the peer benchmark's W1
NANO_VLLM_ROUND_US = 155.0  # nano-vllm's block manager, same workload


def round_chart(rows: list[dict[str, Any]]) -> BarChart:
    """µs per decode round, spec and impl, per R (log scale), with the target and the references."""
    rounds = [row for row in rows if row["operation"] == "round"]
    return BarChart(
        title="One decode round (make room + lower + commit), no-op backend",
        unit="µs per round (log scale)",
        groups=[f"R = {row['requests']}" for row in rounds],
        series={"spec": [row["spec_us"] for row in rounds], "impl": [row["impl_us"] for row in rounds]},
        references=[
            Reference(f"target at R = {ROUND_TARGET_REQUESTS}", ROUND_TARGET_US),
            Reference("vLLM v1 at R = 256", VLLM_ROUND_US),
            Reference("nano-vllm at R = 256", NANO_VLLM_ROUND_US),
        ],
        log_scale=True,
    )


def _table(rows: list[dict[str, Any]]) -> str:
    def number(value: float | None, unit: str) -> str:
        return "-" if value is None else f"{value:,.2f}{unit}"

    header = f"{'workload':<14}{'R':>5}  {'operation':<44}{'spec':>17}{'impl':>15}{'speedup':>10}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['workload']:<14}{row['requests']:>5}  {row['operation']:<44}"
            f"{number(row['spec_us'], ' us'):>17}{number(row['impl_us'], ' us'):>15}{number(row['speedup'], 'x'):>10}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the bench; print the table (or the JSON); 0, or 1 with `--strict` when a target is missed."""
    parser = CommandParser(
        prog="kvsched bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="The other benches, each with its own --help: kvsched bench decode (the decode kernels), "
        "bench engine (the engine's step), bench thrash (recomputation under KV pressure, by admission policy), "
        "bench tiers (a multi-turn workload with and without a host tier).",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run (seconds)")
    parser.add_argument(
        "--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout, instead of the table)"
    )
    parser.add_argument("--spec-rounds", type=int, help="decode rounds the spec replays (default 16, quick 4)")
    parser.add_argument("--repeat", type=int, help="runs per workload, best time kept (default 3, quick 1)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--plot", metavar="PATH", help="also draw the rounds as a chart at PATH (.svg, .png)")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["kvsched bench", *(argv if argv is not None else sys.argv[1:])]))
    plan = QUICK if args.quick else Plan()
    if args.spec_rounds is not None:
        if not 1 <= args.spec_rounds <= plan.rounds:
            parser.error(f"--spec-rounds must be within 1..{plan.rounds}")
        plan = Plan(**{**asdict(plan), "spec_rounds": args.spec_rounds})
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    _log("compiling kernels")
    _warm_up()
    workloads: list[tuple[str, int, Callable[[], dict[str, Timings]]]] = [
        ("decode", requests, partial(bench_decode, requests, plan)) for requests in plan.requests
    ]
    workloads.append(("shared prefix", plan.prefix_requests, partial(bench_shared_prefix, plan)))
    workloads.append(("admission", plan.prefix_requests, partial(bench_admission, plan)))
    results = []
    for workload, requests, run in workloads:
        runs = []
        for repeat in range(args.repeat):
            _log(f"{workload} R={requests}: run {repeat + 1} of {args.repeat}")
            runs.append(run())
        results.append(
            {
                "workload": workload,
                "requests": requests,
                "spec": [timings["spec"] for timings in runs],
                "impl": [timings["impl"] for timings in runs],
            }
        )
    rows = _rows(results)
    report: dict[str, Any] = {
        "measured": measured,
        "plan": asdict(plan),
        "page_size": PAGE_SIZE,
        "repeat": args.repeat,
        "rows": rows,
        "verdict": _verdict(rows),
    }
    if args.json:
        write_json(args.json, report)
    if args.json != "-":
        print(_table(rows))
    if args.plot:
        round_chart(rows).write(args.plot)
    verdict = report["verdict"]
    missed = not verdict["speedup_met"] or verdict["round_met"] is False
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
