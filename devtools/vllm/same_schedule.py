"""The W3 workload and a preempting shared-prefix one through vLLM's own `Scheduler`, over
vLLM's pool and over kvsched's (`KvschedScheduler`): every step's output must be the same.

Each step's `SchedulerOutput` is reduced to what a model runner acts on: the new requests with
their block ids, the running requests' new block ids, the tokens scheduled per request, the
preempted and finished ones. Over kvsched's pool the reduction must equal vLLM's at every step
(the same blocks, in the same order, for the same requests), for W3 (R requests of 512 distinct
tokens, 128 new each, prefix caching on: the peers' W3) and for the live checker's shared-prefix
workload (two salts, three priorities, a pool small enough to preempt). Once kvsched's scheduler
is built, every vLLM name it rebound for the construction must be vLLM's own again. And with
vLLM's CPU-offload connector (`SimpleCPUOffloadConnector`) configured, kvsched's scheduler runs
over kvsched's pool while the offload tier's pool, which vLLM builds through the same coordinator
factory outside any manager, is vLLM's own, bound to kvsched's as its device pool.

With `--expect-different` (a wrong reserve chosen by `KVSCHED_VLLM_RESERVE`) it passes only
when some step differs.

    python same_schedule.py [--json OUT] [--expect-different]   (vLLM's venv; from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

if __package__:
    from devtools.vllm import checker_teeth, thrash
else:  # run as a script from outside the checkout: its folder is on sys.path
    import checker_teeth  # type: ignore[import-not-found,no-redef]
    import thrash  # type: ignore[import-not-found,no-redef]


class Differs(AssertionError):
    """A step's output over kvsched's pool is not vLLM's."""


def reduced(output: Any) -> dict[str, Any]:
    """What a model runner acts on, of one step's `SchedulerOutput`."""
    cached = output.scheduled_cached_reqs
    return {
        "new": [(request.req_id, request.block_ids) for request in output.scheduled_new_reqs],
        "cached": list(zip(cached.req_ids, cached.new_block_ids, strict=True)),
        "tokens": dict(output.num_scheduled_tokens),
        "preempted": sorted(output.preempted_req_ids or ()),
        "finished": sorted(output.finished_req_ids),
    }


def steps(sched: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every step's reduced output, `requests` run to the end."""
    outputs: list[Any] = []
    checker_teeth.run(sched, requests, seen=outputs)
    return [reduced(output) for output in outputs]


def left_behind() -> None:
    """Raise unless, its scheduler built, every vLLM name kvsched rebinds for the construction is
    vLLM's own again (a pool built from here on, the CPU-offload tier's among them, is vLLM's)."""
    import vllm.v1.core.kv_cache_coordinator as coordinator
    import vllm.v1.core.sched.scheduler as scheduler
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from kvsched.integrations.vllm.block_pool import VLLM_BLOCK_POOL

    if coordinator.BlockPool is not VLLM_BLOCK_POOL or scheduler.KVCacheManager is not KVCacheManager:
        raise AssertionError("kvsched's scheduler left a rebinding behind after its construction")


def offload_tier() -> dict[str, Any]:
    """Build kvsched's scheduler with vLLM's CPU-offload connector; raise unless its pool is
    kvsched's and the offload tier's is vLLM's, bound to kvsched's as the device pool."""
    from kvsched.integrations.vllm.block_pool import VLLM_BLOCK_POOL, KvschedBlockPool
    from kvsched.integrations.vllm.scheduler import KvschedScheduler

    offload: dict[str, Any] = {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both"}
    offload["kv_connector_extra_config"] = {"num_cpu_blocks": 64}
    sched = thrash.scheduler(64, True, offload, 32, 2048, KvschedScheduler)
    device = sched.kv_cache_manager.block_pool
    tier = sched.connector.scheduler_manager
    if type(device) is not KvschedBlockPool:
        raise AssertionError(f"the scheduler's pool is {type(device).__qualname__}, not KvschedBlockPool")
    if type(tier.cpu_block_pool) is not VLLM_BLOCK_POOL:
        kind = type(tier.cpu_block_pool).__qualname__
        raise AssertionError(f"the offload tier's pool is {kind}, not vLLM's BlockPool")
    if tier._gpu_block_pool is not device:
        raise AssertionError("the offload tier is not bound to kvsched's pool as its device pool")
    left_behind()
    return {"device_pool": type(device).__qualname__, "offload_pool": f"vllm {type(tier.cpu_block_pool).__qualname__}"}


def compare(name: str, blocks: int, requests: list[dict[str, Any]], max_seqs: int, max_tokens: int) -> dict[str, Any]:
    """`requests` through vLLM's scheduler over each pool; `Differs` at the first step that does."""
    from kvsched.integrations.vllm.block_pool import KvschedBlockPool
    from kvsched.integrations.vllm.scheduler import KvschedScheduler

    stock = steps(thrash.scheduler(blocks, True, None, max_seqs, max_tokens), requests)
    ours_scheduler = thrash.scheduler(blocks, True, None, max_seqs, max_tokens, KvschedScheduler)
    assert isinstance(ours_scheduler.kv_cache_manager.block_pool, KvschedBlockPool)
    left_behind()
    ours = steps(ours_scheduler, requests)
    for index, (theirs, mine) in enumerate(zip(stock, ours, strict=False)):
        if theirs != mine:
            raise Differs(f"{name}: step {index} differs over kvsched's pool:\n vLLM's  {theirs}\n kvsched {mine}")
    if len(stock) != len(ours):
        raise Differs(f"{name}: {len(stock)} steps over vLLM's pool, {len(ours)} over kvsched's")
    preempted = sum(len(step["preempted"]) for step in stock)
    blocks_handed = sum(len(ids[0]) for step in stock for _, ids in step["new"] if ids)
    return {"workload": name, "steps": len(stock), "preemptions": preempted, "new_request_blocks": blocks_handed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--expect-different", action="store_true", help="pass only if some step differs")
    args = parser.parse_args(argv)
    requests = 128
    try:
        rows = [
            compare(
                "W3 R=128",
                checker_teeth.w3_blocks(requests),
                checker_teeth.w3(requests),
                max_seqs=requests,
                max_tokens=8192,
            ),
            compare(
                "shared prefixes, preempting", 120, checker_teeth.shared_prefix_workload(), max_seqs=32, max_tokens=2048
            ),
        ]
    except Differs as difference:
        if args.expect_different:
            print(f"different, as a wrong reserve must be: {str(difference).splitlines()[0]}", file=sys.stderr)
            return 0
        raise
    if args.expect_different:
        print("every step identical over a wrong reserve", file=sys.stderr)
        return 1
    for row in rows:
        print(f"identical: {row}", file=sys.stderr)
    tier = offload_tier()
    print(f"with the CPU-offload connector: {tier}", file=sys.stderr)
    if not rows[1]["preemptions"]:
        raise AssertionError("the shared-prefix workload must preempt")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"workloads": rows, "with_cpu_offload": tier}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
