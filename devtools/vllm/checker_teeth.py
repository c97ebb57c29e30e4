"""The live checker (`kvsched.integrations.vllm.checker`) on vLLM's own scheduler: silent on stock,
each broken pool caught by its named check, and its cost per step.

The installed vLLM's v1 `Scheduler` (each tested release) with the checker as its KV connector
(prefix caching on, the priority policy, a pool small enough to preempt) runs a seeded workload
of shared prefixes under two cache salts to the end: on vLLM's own `BlockPool` it must find
nothing. Then four deliberately broken pools and a broken hasher, each the shape of a shipped
bug, must each be caught, in "raise" mode, by the check named:

    queued_twice   a pool whose free queues a freed block it already queued (a block listed twice
                   in the free queue: ai-dynamo/dynamo PR #13398's shape) -> free_queue
    listed_twice   a pool whose free takes a block listed twice in one call as two frees, so a
                   block another request holds is counted 0 and queued (vLLM #42571's shape)
                   -> free_in_table
    stale_hash     a pool that drops a reused block's hash but keeps it in the hash map
                   (kvcached #362's shape) -> cache_map
    salt_dropped   requests whose block hashes leave their cache salt out, so one tenant's
                   blocks serve another's (what vLLM PR #53347 would verify) -> salt
    key_outlives   a pool that hands a cached block out keeping its hash (the map names it while
                   its new owner writes it: a later prompt reads that KV) and drops the stale key
                   just before caching the block again (vLLM #49449's class: a stale block
                   hash makes the wrong prefix hit) -> stale_key
    stale_pool     the same without the drop (vLLM's own assertion fires when the block is cached
                   again: the checker must see it first) -> stale_key
    restored       a pool that publishes a block it evicts stored again after its BlockRemoved
                   (vLLM #49125's shape: a router's index keeps it) -> kv_events

The scheduler publishes KV events (vLLM's null publisher), which the checker folds at each step.

(A block only one request holds, freed twice, goes below zero and trips vLLM's own assertion at
the next allocation; a shared one, the shape above, is handed out silently.)

The checker reads what each step changed and the whole pool every 64 steps (its default): each
broken shape must be caught at the step it breaks the pool, by the whole check that step's
reading sends (every shape breaks the pool before step 64).

Cost: the W3 workload (R requests of 512 distinct tokens, 128 new each, prefix caching on; the
peers' vLLM W3), CPU time per `schedule()` + `update_from_output()` with and without the checker
(its default; with KV events on; the whole pool at every step), median and mean step.

    python checker_teeth.py [--json OUT]      (vLLM's venv; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

if __package__:
    from devtools.vllm import thrash
else:  # run as a script from outside the checkout: its folder is on sys.path
    import thrash  # type: ignore[import-not-found,no-redef]

BLOCK = thrash.BLOCK

CHECKER = {
    "kv_connector": "KvschedChecker",
    "kv_connector_module_path": "kvsched.integrations.vllm.checker",
    "kv_role": "kv_producer",
}


def scheduler(
    blocks: int,
    checker: bool,
    max_seqs: int = 32,
    max_tokens: int = 2048,
    kv_events: bool = True,
    every: int | None = None,
) -> Any:
    """vLLM's v1 `Scheduler` over `blocks` blocks, prefix caching on, KV events on (unless told
    not), the checker as its connector when `checker` (the whole pool every `every` steps, its
    default when None)."""
    connector: dict[str, Any] | None = None
    if checker:
        connector = dict(CHECKER)
        if every is not None:
            connector["kv_connector_extra_config"] = {"kvsched_whole_every": every}
    return thrash.scheduler(blocks, True, connector, max_seqs, max_tokens, kv_events=kv_events)


W3_PROMPT, W3_NEW = 512, 128


def w3(requests: int) -> list[dict[str, Any]]:
    """The peers' W3: R requests of 512 distinct tokens, 128 new each."""
    return [
        {
            "id": str(i),
            "prompt": list(range(i * W3_PROMPT + 1, (i + 1) * W3_PROMPT + 1)),
            "max_tokens": W3_NEW,
            "priority": 0,
            "salt": None,
        }
        for i in range(requests)
    ]


def w3_blocks(requests: int) -> int:
    """A pool W3 runs in without preempting (every request's blocks and 64 more)."""
    return requests * -(-(W3_PROMPT + W3_NEW + 1) // BLOCK) + 64


def shared_prefix_workload(seed: int = 0, count: int = 48) -> list[dict[str, Any]]:
    """Requests over four shared prefixes (some 3 blocks long, some not a whole block), two cache
    salts, 8 to 40 new tokens, 3 priorities."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30_000) for _ in range(length)] for length in (48, 40, 100, 17)]
    requests = []
    for index in range(count):
        prefix = prefixes[index % len(prefixes)]
        tail = [rng.randrange(1, 30_000) for _ in range(rng.randrange(0, 60))]
        requests.append(
            {
                "id": str(index),
                "prompt": prefix + tail,
                "max_tokens": rng.randrange(8, 41),
                "priority": rng.randrange(3),
                "salt": None if index % 3 else "tenant-b",
            }
        )
    return requests


def add_requests(sched: Any, requests: list[dict[str, Any]], drop_salt: bool = False) -> None:
    """`requests` added to `sched` as vLLM's engine core makes them (block hashes included; with
    `drop_salt`, hashes that leave the cache salt out)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)  # as vLLM's engine core makes each Request's
    if drop_salt:
        hasher = saltless(hasher)
    for request in requests:
        sched.add_request(
            Request(
                request_id=request["id"],
                prompt_token_ids=list(request["prompt"]),
                sampling_params=SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True),
                pooling_params=None,
                priority=request["priority"],
                cache_salt=request["salt"],
                block_hasher=hasher,
            )
        )


def run(
    sched: Any,
    requests: list[dict[str, Any]],
    timed: list[float] | None = None,
    drop_salt: bool = False,
    seen: list[Any] | None = None,
) -> dict[str, int]:
    """`requests` through `sched` to the end (a model that samples token 7); steps, preemptions.
    With `drop_salt`, the requests' block hashes leave their cache salt out (a broken hasher);
    `seen` receives every step's `SchedulerOutput`."""
    add_requests(sched, requests, drop_salt)
    steps = preemptions = 0
    while sched.has_requests():
        started = time.thread_time()
        output, _ = thrash.step(sched)
        if seen is not None:
            seen.append(output)
        if timed is not None:
            timed.append(time.thread_time() - started)
        preemptions += len(output.preempted_req_ids or ())
        steps += 1
        if steps > 20_000:
            raise AssertionError("the scheduler did not finish the workload in 20,000 steps")
    return {"steps": steps, "preemptions": preemptions}


# -- the broken shapes --------------------------------------------------------------------------


def saltless(hasher: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
    """`hasher`, made blind to the request's cache salt."""

    def hash_without_salt(request: Any) -> list[Any]:
        salt, request.cache_salt = request.cache_salt, None
        try:
            return hasher(request)
        finally:
            request.cache_salt = salt

    return hash_without_salt


def listed_twice() -> type:
    """A pool whose free takes a block listed twice as two frees: a block another request still
    holds is counted 0 and queued, to be handed out again."""
    from vllm.v1.core.block_pool import BlockPool

    class ListedTwice(BlockPool):  # type: ignore[misc]
        def free_blocks(self, ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            shared = [block for block in blocks if block.ref_cnt == 2 and not block.is_null]
            super().free_blocks(blocks + shared[:1])

    return ListedTwice


def queued_twice() -> type:
    """A pool whose free queues a freed cached block a second time (appends it to the free queue
    it is already in): the queue's links lose the blocks behind it, and its count gains one."""
    from vllm.v1.core.block_pool import BlockPool

    class QueuedTwice(BlockPool):  # type: ignore[misc]
        def free_blocks(self, ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            super().free_blocks(blocks)
            freed = [block for block in blocks if block.ref_cnt == 0 and block.block_hash is not None]
            if freed:
                self.free_block_queue.append(freed[0])

    return QueuedTwice


def stale_hash() -> type:
    """A pool that, reusing a cached block, drops its hash but leaves it in the hash map."""
    from vllm.v1.core.block_pool import BlockPool

    class StaleHash(BlockPool):  # type: ignore[misc]
        def _maybe_evict_cached_block(self, block: Any) -> bool:
            had = block.block_hash is not None
            block.reset_hash()
            return had

    return StaleHash


def key_outlives() -> type:
    """`kvsched check`'s own: a pool that hands a cached block out keeping its hash and drops the
    stale key just before caching the block again."""
    from kvsched.testing.adapters.vllm import key_outlives_class

    return key_outlives_class()


def stale_pool() -> type:
    """`kvsched check`'s own: a pool that hands a cached block out keeping its hash (vLLM's
    assertion fires when it is cached again, later)."""
    from kvsched.testing.adapters.vllm import stale_pool_class

    return stale_pool_class()


def restored() -> type:
    """A pool that publishes a block it evicts stored again after its `BlockRemoved` (vLLM
    #49125's shape: a router's index keeps a block the pool dropped); `kvsched check`'s own."""
    from kvsched.testing.adapters.vllm import restored_pool_class

    return restored_pool_class()


BROKEN: dict[str, tuple[Callable[[], type] | None, str]] = {
    "queued_twice": (queued_twice, "free_queue"),
    "listed_twice": (listed_twice, "free_in_table"),
    "stale_hash": (stale_hash, "cache_map"),
    "salt_dropped": (None, "salt"),
    "key_outlives": (key_outlives, "stale_key"),
    "stale_pool": (stale_pool, "stale_key"),
    "restored": (restored, "kv_events"),
}


@contextmanager
def pool_class(cls: type) -> Iterator[None]:
    """Schedulers built inside get `cls` as their pool (this driver only: vLLM's name, patched
    for the construction and restored)."""
    with mock.patch("vllm.v1.core.kv_cache_coordinator.BlockPool", cls):
        yield


def silent_on_stock(blocks: int) -> dict[str, Any]:
    sched = scheduler(blocks, checker=True)
    counts = run(sched, shared_prefix_workload())
    connector = sched.connector
    assert not connector.findings, connector.findings
    if counts["preemptions"] == 0:
        raise AssertionError(f"no preemption over {blocks} blocks: the workload must preempt")
    return {"blocks": blocks, **counts, "checks": connector.steps, "findings": 0}


def caught(name: str, blocks: int, every: int | None = None) -> dict[str, Any]:
    """The broken shape `name` caught by its named check (the whole pool every `every` steps, the
    checker's default when None); at the same step as by the whole check at every step."""
    from vllm.v1.core.block_pool import BlockPool

    from kvsched.integrations.vllm.live import LiveFinding

    make, check = BROKEN[name]
    with pool_class(BlockPool if make is None else make()):
        sched = scheduler(blocks, checker=True, every=every)
    try:
        run(sched, shared_prefix_workload(), drop_salt=make is None)
    except LiveFinding as error:
        checks = sorted({finding.check for finding in error.findings})
        if check not in checks:
            raise AssertionError(f"{name}: caught by {checks}, not by {check}") from error
        step = sched.connector.steps
        if every is None and caught(name, blocks, every=1)["step"] != step:
            raise AssertionError(
                f"{name}: caught at step {step}, not at the step the whole check at every step is"
            ) from error
        return {
            "broken": name,
            "caught_by": checks,
            "first": str(error.findings[0]),
            "step": step,
            "whole_checks": sched.connector.checking.delta.whole_checks,  # the first step's, and the one sent
        }
    raise AssertionError(f"{name}: the checker found nothing")


def cost(requests: int, repeats: int, kv_events: bool = False, every: int | None = None) -> dict[str, Any]:
    """CPU time per step on W3 with and without the checker (reading what each step changed, the
    whole pool every `every` steps: its default when None), the median and the mean step of
    `repeats` runs each, interleaved; the median of their per-run figures."""
    workload = w3(requests)
    blocks = w3_blocks(requests)
    median: dict[bool, list[float]] = {False: [], True: []}
    mean: dict[bool, list[float]] = {False: [], True: []}
    steps = whole = 0
    for _ in range(repeats):
        for checker in (False, True):
            timed: list[float] = []
            sched = scheduler(blocks, checker, max_seqs=requests, max_tokens=8192, kv_events=kv_events, every=every)
            run(sched, workload, timed)
            median[checker].append(statistics.median(timed) * 1e6)
            mean[checker].append(statistics.fmean(timed) * 1e6)
            if checker:
                steps, whole = sched.connector.steps, sched.connector.checking.delta.whole_checks
    stock, checked = statistics.median(median[False]), statistics.median(median[True])
    stock_mean, checked_mean = statistics.median(mean[False]), statistics.median(mean[True])
    return {
        "R": requests,
        "kv_events": kv_events,
        "whole_every": every,
        "steps": steps,
        "whole_checks": whole,
        "stock_us": round(stock, 1),
        "checked_us": round(checked, 1),
        "overhead_us": round(checked - stock, 1),
        "ratio": round(checked / stock, 2),
        "stock_mean_us": round(stock_mean, 1),
        "checked_mean_us": round(checked_mean, 1),
        "mean_ratio": round(checked_mean / stock_mean, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"stock": silent_on_stock(120)}
    print(f"stock: {result['stock']}", file=sys.stderr)
    result["broken"] = [caught(name, 120) for name in BROKEN]
    for row in result["broken"]:
        print(f"caught: {row}", file=sys.stderr)
    result["cost"] = cost(256, args.repeats)  # events off: the figure earlier runs measured
    result["cost_events"] = cost(256, args.repeats, kv_events=True)
    result["cost_whole"] = cost(256, args.repeats, every=1)  # the whole pool at every step
    for name in ("cost", "cost_events", "cost_whole"):
        print(f"{name}: {result[name]}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
