"""W1 and W2 through vLLM's own `KVCacheManager`, over vLLM's `BlockPool` and over kvsched's.

The peer benchmark's workloads, both pools in one process, interleaved, the fastest of `--repeats`
runs (as `timeit` reports: a slower run is the machine's other work, not the code's) and their median,
timed by this process's CPU time (`--clock cpu`, the default, as the peers' `CLOCK=cpu`) or
wall time (`--clock wall`), each pool run first in every other repeat:

    W1  decode steady state: R requests of a 512-token prompt admitted, then 256 decode steps,
        each step one `allocate_slots(request, 1)` per request and a sampled token appended
        (vLLM hashes each newly full block); prefix caching on; µs per decode step
    W2  shared prefix: 256 requests of a 1,024-token shared prefix and 128 tokens of their own,
        each `get_computed_blocks` then `allocate_slots`; µs per admitted request (request
        construction and its hashing not included, as in the peer benchmark)

A second run of each records the calls the manager makes into its pool and replays them, timed,
on a fresh pool of the same class: the pool's own share, so the table says what the layers
above it (the coordinator, the single-type manager, `KVCacheManager`) cost.

`--count instructions` counts instead of timing: each workload over each pool runs in its own
process under valgrind's callgrind with instrumentation off, runs once (imports, first calls), then
again with instrumentation turned on exactly around its timed loop (the process waits at the loop's
two clock readings while this driver runs `callgrind_control -i on|off`). Instructions per step or
request, with `PYTHONHASHSEED=0`, repeat to about 0.03% whatever else the machine runs, so the
count gives a verdict that load cannot move; the times are what the instructions cost.

    python bench_pool.py [--repeats 8] [--clock cpu] [--json OUT]   (vLLM's venv; from outside the checkout)
    python bench_pool.py --count instructions [--json OUT]          (needs valgrind)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kvsched.report import measurement

BLOCK = 16
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]  # this process's CPU time: what another process on the machine takes is not counted
POOL_METHODS = (
    "get_new_blocks",
    "touch",
    "free_blocks",
    "get_cached_block",
    "cache_full_blocks",
    "get_num_free_blocks",
)


class Vllm:
    def __init__(self) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request, RequestStatus

        from kvsched.integrations.vllm import block_pool

        self.block_pool = block_pool
        hash_fn = get_hash_fn_by_name("sha256")
        kv_cache_utils.init_none_hash(hash_fn)
        self.hasher = kv_cache_utils.get_request_block_hasher(BLOCK, hash_fn)
        self.torch, self.KVCacheManager, self.SamplingParams = torch, KVCacheManager, SamplingParams
        self.Request, self.RequestStatus = Request, RequestStatus
        self.specs = (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec)

    def manager(self, blocks: int, max_model_len: int, pool: str) -> Any:
        spec_class, config_class, group_class = self.specs
        spec = spec_class(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=self.torch.float32)
        config = config_class(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[group_class(["layer"], spec)])
        manager_class = self.block_pool.KvschedKVCacheManager if pool == "kvsched" else self.KVCacheManager
        return manager_class(
            config,
            max_model_len=max_model_len,
            scheduler_block_size=BLOCK,
            hash_block_size=BLOCK,
            enable_caching=True,
            log_stats=False,
        )

    def request(self, request_id: int, tokens: list[int], max_tokens: int) -> Any:
        params = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return self.Request(str(request_id), tokens, params, None, block_hasher=self.hasher)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


Calls = list[tuple[str, tuple[Any, ...], dict[str, Any]]]


def record(manager: Any) -> Calls:
    """Log every call the manager makes into its pool, blocks by id (a call the pool makes to
    itself is part of the outer call); `replay` repeats them on a fresh pool."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    pool = manager.block_pool
    depth = [0]

    def ids(value: Any) -> Any:
        if isinstance(value, (list, tuple)) and value and hasattr(value[0], "block_id"):
            return ("blocks", [block.block_id for block in value])
        return value

    def wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def logged(*args: Any, **kwargs: Any) -> Any:
            if name == "free_blocks":  # its argument may be an iterator: read it once
                args = tuple(list(arg) for arg in args)
            if not depth[0]:
                listed = tuple(ids(arg) for arg in args)
                calls.append((name, listed, {key: ids(value) for key, value in kwargs.items()}))
            depth[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1

        return logged

    for name in POOL_METHODS:
        setattr(pool, name, wrap(name, getattr(pool, name)))
    return calls


def replay(pool_class: type[Any], blocks: int, calls: Calls, timed: range) -> float:
    """Seconds a fresh pool of `pool_class` takes to serve `calls[timed]`, after serving the
    calls before them untimed (the arguments rebuilt on the fresh pool's blocks first)."""
    pool = pool_class(blocks, enable_caching=True, hash_block_size=BLOCK)

    def rebuilt(arg: Any) -> Any:
        if isinstance(arg, tuple) and arg[:1] == ("blocks",):
            return [pool.blocks[page] for page in arg[1]]
        return arg

    bound = [
        (getattr(pool, name), tuple(map(rebuilt, args)), {key: rebuilt(value) for key, value in kwargs.items()})
        for name, args, kwargs in calls[: timed.stop]
    ]
    for method, args, kwargs in bound[: timed.start]:
        method(*args, **kwargs)
    started = clock()
    for method, args, kwargs in bound[timed.start :]:
        method(*args, **kwargs)
    return clock() - started


def pool_class(v: Vllm, pool: str) -> type[Any]:
    if pool == "kvsched":
        return cast(type[Any], v.block_pool.KvschedBlockPool)
    return cast(type[Any], v.block_pool.VLLM_BLOCK_POOL)


def w1(v: Vllm, pool: str, timed_pool: bool, requests: int, prompt: int = 512, steps: int = 256) -> dict[str, float]:
    blocks = requests * cdiv(prompt + steps + 1, BLOCK) + 64
    manager = v.manager(blocks, prompt + steps + 64, pool)
    calls = record(manager) if timed_pool else []
    reqs = [v.request(i, list(range(i * prompt + 1, (i + 1) * prompt + 1)), steps + 1) for i in range(requests)]
    for request in reqs:
        computed, hit, _ = manager.get_computed_blocks(request)
        assert manager.allocate_slots(request, prompt - hit, hit, computed) is not None
        request.status = v.RequestStatus.RUNNING
        request.num_computed_tokens = prompt
        request.append_output_token_ids(7)
    first = len(calls)
    allocate = manager.allocate_slots
    started = clock()
    for _ in range(steps):
        for request in reqs:
            if allocate(request, 1) is None:
                raise RuntimeError("the pool is too small")
            request.num_computed_tokens += 1
            request.append_output_token_ids(7)
    decode = clock() - started
    pool_s = replay(pool_class(v, pool), blocks, calls, range(first, len(calls))) if timed_pool else 0.0
    for request in reqs:
        manager.free(request)
    assert manager.block_pool.get_num_free_blocks() == blocks - 1
    return {"us_per_step": decode / steps * 1e6, "pool_us_per_step": pool_s / steps * 1e6}


def w2(v: Vllm, pool: str, timed_pool: bool, n: int = 256, prefix: int = 1024, unique: int = 128) -> dict[str, float]:
    blocks = cdiv(prefix, BLOCK) + n * cdiv(unique, BLOCK) + 64
    manager = v.manager(blocks, prefix + unique + 64, pool)
    calls = record(manager) if timed_pool else []
    shared = list(range(1, prefix + 1))
    reqs = [v.request(i, shared + list(range(10**7 + i * unique, 10**7 + (i + 1) * unique)), 1) for i in range(n)]
    hits = 0
    started = clock()
    for request in reqs:
        computed, hit, _ = manager.get_computed_blocks(request)
        new = request.num_tokens - hit
        if manager.allocate_slots(request, new, hit, computed, full_sequence_must_fit=True) is None:
            raise RuntimeError("the pool is too small")
        request.status = v.RequestStatus.RUNNING
        request.num_computed_tokens = hit + new
        hits += hit
    admit = clock() - started
    pool_s = replay(pool_class(v, pool), blocks, calls, range(0, len(calls))) if timed_pool else 0.0
    for request in reqs:
        manager.free(request)
    return {"us_per_request": admit / n * 1e6, "pool_us_per_request": pool_s / n * 1e6, "hit_tokens": hits}


POLL_S = 0.05


def wait_for(path: Path, process: subprocess.Popen[bytes] | None = None) -> None:
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the counted process ended early (exit {process.returncode})")
        time.sleep(POLL_S)


def counted_child(workload: str, pool: str, requests: int, gate: Path) -> None:
    """Runs under callgrind: the workload once, then again, stopping at its timed loop's two clock
    readings until the driver has turned instrumentation on (at the first) and off (at the second)."""
    global clock
    v = Vllm()
    run: Callable[[], Any] = (
        functools.partial(w1, v, pool, False, requests) if workload == "w1" else functools.partial(w2, v, pool, False)
    )
    run()
    readings = 0

    def gated() -> float:
        nonlocal readings
        readings += 1
        signal, answer = ("ready", "on") if readings == 1 else ("done", "off")
        (gate / signal).touch()
        wait_for(gate / answer)
        return time.process_time()

    clock = gated
    run()


def instructions(workload: str, pool: str, requests: int) -> int:
    """The instructions of one timed loop of `workload` over `pool`, counted by callgrind."""
    with tempfile.TemporaryDirectory() as scratch:
        gate = Path(scratch)
        out = gate / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--counted-child", workload, pool, str(requests), str(gate),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts, the same count
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for signal, state in (("ready", "on"), ("done", "off")):
            wait_for(gate / signal, process)
            subprocess.run(["callgrind_control", "-i", state, str(process.pid)], check=True, capture_output=True)
            (gate / state).touch()
        if process.wait() != 0:
            raise RuntimeError(f"{workload} over {pool}: exit {process.returncode}")
        for line in out.read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"{workload} over {pool}: callgrind wrote no totals")


def count_instructions(args: argparse.Namespace) -> list[dict[str, Any]]:
    cases = [(f"W1 R={r}", "instructions per decode step", "w1", r, 256) for r in args.requests]
    cases.append(("W2 N=256", "instructions per admitted request", "w2", 0, 256))
    rows: list[dict[str, Any]] = []
    for name, unit, workload, requests, per in cases:
        row: dict[str, Any] = {"case": name, "unit": unit}
        for pool in ("stock", "kvsched"):
            started = time.perf_counter()
            row[pool] = instructions(workload, pool, requests) / per
            elapsed = time.perf_counter() - started
            print(f"  {name} {pool}: {row[pool]:,.0f} {unit} ({elapsed:.0f} s)", file=sys.stderr, flush=True)
        row["kvsched_over_stock"] = row["kvsched"] / row["stock"]
        rows.append(row)
    print(f"{'case':<10} {'unit':<34} {'stock':>12} {'kvsched':>12} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['case']:<10} {row['unit']:<34} {row['stock']:>12,.0f} {row['kvsched']:>12,.0f}"
            f" {row['kvsched_over_stock']:>6.3f}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--counted-child"]:
        workload, pool, requests, gate = argv[1:5]
        counted_child(workload, pool, int(requests), Path(gate))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", choices=("time", "instructions"), default="time")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--requests", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.count == "instructions":
        rows = count_instructions(args)
        if args.json:
            measured = measurement("make vllm (devtools/vllm/bench_pool.py " + " ".join(argv) + ")")
            args.json.write_text(json.dumps({"measured": measured, "rows": rows}, indent=1) + "\n")
        return 0
    v = Vllm()
    rows = []
    cases: list[tuple[str, str, Callable[[str, bool], dict[str, float]], str]] = [
        (f"W1 R={r}", "µs per decode step", functools.partial(w1, v, requests=r), "us_per_step") for r in args.requests
    ]
    cases.append(("W2 N=256", "µs per admitted request", functools.partial(w2, v), "us_per_request"))
    for name, unit, run, key in cases:
        times: dict[str, list[float]] = {"stock": [], "kvsched": []}
        pool_share: dict[str, list[float]] = {"stock": [], "kvsched": []}
        for repeat in range(args.repeats):
            # Each pool first in every other repeat: the second of two runs in a row is the
            # slower on this machine, whichever pool it is.
            for pool in ("stock", "kvsched") if repeat % 2 == 0 else ("kvsched", "stock"):
                times[pool].append(run(pool, False)[key])
                pool_share[pool].append(run(pool, True)[f"pool_{key}"])
                print(f"  {name} {pool} #{repeat + 1}: {times[pool][-1]:.1f} {unit}", file=sys.stderr, flush=True)
        row: dict[str, Any] = {
            "case": name,
            "unit": unit,
            **{f"{pool}": min(values) for pool, values in times.items()},
            **{f"{pool}_median": statistics.median(values) for pool, values in times.items()},
            **{f"{pool}_in_pool": min(values) for pool, values in pool_share.items()},
            "runs": times,
        }
        row["kvsched_over_stock"] = row["kvsched"] / row["stock"]
        row["median_kvsched_over_stock"] = row["kvsched_median"] / row["stock_median"]
        row["in_pool_kvsched_over_stock"] = row["kvsched_in_pool"] / row["stock_in_pool"]
        rows.append(row)
    header = f"{'case':<12} {'unit':<24} {'stock':>9} {'kvsched':>9} {'ratio':>6} {'median':>6}"
    print(header + "   in the pool: stock / kvsched")
    for row in rows:
        print(
            f"{row['case']:<12} {row['unit']:<24} {row['stock']:>9.1f} {row['kvsched']:>9.1f}"
            f" {row['kvsched_over_stock']:>6.2f} {row['median_kvsched_over_stock']:>6.2f}"
            f"   {row['stock_in_pool']:.1f} / {row['kvsched_in_pool']:.1f}"
        )
    if args.json:
        measured = measurement("make vllm (devtools/vllm/bench_pool.py " + " ".join(argv) + ")")
        args.json.write_text(json.dumps({"measured": measured, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
