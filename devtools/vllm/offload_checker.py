"""The live checker beside vLLM's CPU-offloading connector, on vLLM's own scheduler: silent on the
stock connector, eager and lazy, and each broken offloading shape caught by the check named.

The installed vLLM's v1 `Scheduler` (prefix caching on, the priority policy, a pool small enough
to evict) runs a seeded workload whose documents come back after their blocks were evicted, so
the CPU tier stores them (lazy mode: from the free queue's eviction end, freed back to its front
once stored, 0.34's `evict_first`) and loads them back. A model runner stands in for the
workers: it reports each store and load complete one to three steps after it was issued, out of
order. The connector is `KvschedMultiConnector` (vLLM's MultiConnector, checking after its
connectors) around `SimpleCPUOffloadConnector`.

    stock (eager, lazy)   silent, with stores, loads and blocks freed to the front counted (0.34:
                          at least one; 0.32 frees a store's blocks as any other)
    plain checker         kvsched's plain checker in vLLM's own MultiConnector beside the lazy
                          tier: it cannot see the tier's copies, and must report them (why the
                          KvschedMultiConnector exists)
    told of no store      (0.34) KvschedMultiConnector whose checker ignores the stores it sees
                          must report free_order alone on the stock lazy tier: the allowance for
                          blocks freed to the front is what keeps it silent, and nothing else
    store_unpinned        a lazy store that gives its device blocks back to the free queue while
                          the copy still reads them (a save holding no reference on what it
                          reads: DingoCache PR #76, SGLang #24527) -> copy_in_flight
    load_unpinned         a load that drops its hold on the device blocks it writes: a request
                          that finishes or is preempted meanwhile frees them to another while
                          the copy lands (blocks under a transfer left unpinned: TRT-LLM
                          #17926) -> refcount
    keyed_before_stored   a store that publishes its host block's key when it is issued, before
                          the copy lands: a lookup meanwhile loads what is not there yet (a
                          transfer counted as landed before it has: Dynamo #15079)
                          -> copy_in_flight on the host pool

    python offload_checker.py [--json OUT]      (vLLM's venv, 0.32.0 or 0.34.0; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from typing import Any

if __package__:
    from devtools.vllm import checker_teeth, thrash
else:  # run as a script from outside the checkout: its folder is on sys.path
    import checker_teeth  # type: ignore[import-not-found,no-redef]
    import thrash  # type: ignore[import-not-found,no-redef]

BLOCK = thrash.BLOCK
DOCUMENT_BLOCKS = 4  # each document's prompt is this many whole blocks, then a tail of its own
MAX_STEPS = 5_000
HOST_BLOCKS = 48
PAGE_BYTES = 2 * BLOCK * 4  # thrash.scheduler's layer: K and V, one head of one float32 per token


def offload(lazy: bool, connector: str = "SimpleCPUOffloadConnector", module: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "kv_connector": connector,
        "kv_role": "kv_both",
        # 0.34 reads num_cpu_blocks; 0.32 sizes its pool from the bytes alone
        "kv_connector_extra_config": {
            "lazy_offload": lazy,
            "num_cpu_blocks": HOST_BLOCKS,
            "cpu_bytes_to_use": HOST_BLOCKS * PAGE_BYTES,
        },
    }
    if module is not None:
        config["kv_connector_module_path"] = module
    return config


def multi(connectors: list[dict[str, Any]], checking: bool = True) -> dict[str, Any]:
    """`KvschedMultiConnector` (or, without `checking`, vLLM's own MultiConnector) around `connectors`."""
    config: dict[str, Any] = {
        "kv_connector": "KvschedMultiConnector" if checking else "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": connectors, "kvsched_on_finding": "raise"},
    }
    if checking:
        config["kv_connector_module_path"] = "kvsched.integrations.vllm.checker"
    return config


PLAIN_CHECKER = {
    "kv_connector": "KvschedChecker",
    "kv_connector_module_path": "kvsched.integrations.vllm.checker",
    "kv_role": "kv_producer",
    "kv_connector_extra_config": {"kvsched_on_finding": "log"},
}


def workload(seed: int = 0, count: int = 96) -> list[dict[str, Any]]:
    """Requests over twelve documents in turn (so each comes back after the pool has evicted it),
    each with a tail of its own, two cache salts, 2 to 24 new tokens, 3 priorities."""
    rng = random.Random(seed)
    documents = [[rng.randrange(1, 30_000) for _ in range(DOCUMENT_BLOCKS * BLOCK)] for _ in range(12)]
    return [
        {
            "id": str(index),
            "prompt": documents[index % len(documents)] + tail(rng),
            "max_tokens": rng.randrange(2, 25),
            "priority": rng.randrange(3),
            "salt": None if index % 5 else "tenant-b",
        }
        for index in range(count)
    ]


def tail(rng: random.Random) -> list[int]:
    return [rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 40))]


class Workers:
    """The workers' side: every store and load the scheduler issues completes one to three steps
    later (seeded), out of order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.stores: list[tuple[int, int]] = []  # (due step, event)
        self.loads: list[tuple[int, str]] = []  # (due step, request)
        self.issued = {"stores": 0, "stored_blocks": 0, "loads": 0, "loaded_blocks": 0}

    def output(self, step: int, scheduled: Any) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

        metadata = [meta for meta in scheduled.kv_connector_metadata.metadata if hasattr(meta, "store_event")]
        for meta in metadata:
            if meta.store_event >= 0:
                self.stores.append((step + self.rng.randrange(1, 4), meta.store_event))
                self.issued["stores"] += 1
                self.issued["stored_blocks"] += len(meta.store_gpu_blocks)
            if meta.load_event >= 0:
                for request in meta.load_event_to_reqs[meta.load_event]:
                    self.loads.append((step + self.rng.randrange(1, 4), request))
                self.issued["loads"] += 1
                self.issued["loaded_blocks"] += len(meta.load_gpu_blocks)
        done_stores = {event: 1 for due, event in self.stores if due <= step}
        done_loads = {request for due, request in self.loads if due <= step}
        self.stores = [(due, event) for due, event in self.stores if due > step]
        self.loads = [(due, request) for due, request in self.loads if due > step]
        worker = SimpleCPUOffloadWorkerMetadata(completed_store_events=done_stores)
        slots = len(scheduled.kv_connector_metadata.metadata)
        per_connector = tuple(worker if index == 0 else None for index in range(slots))
        return KVConnectorOutput(
            finished_recving=done_loads, kv_connector_worker_meta=MultiKVConnectorWorkerMetadata(per_connector)
        )


def run(kv_transfer: dict[str, Any], seed: int = 0, blocks: int = 40) -> tuple[Any, dict[str, int]]:
    """The workload through vLLM's scheduler over `blocks` blocks with `kv_transfer`'s connector,
    to the end: the scheduler, and what was counted."""
    from vllm.v1.outputs import ModelRunnerOutput

    sched = thrash.scheduler(blocks, True, kv_transfer, max_seqs=8, max_tokens=256)
    checker_teeth.add_requests(sched, workload(seed))
    workers = Workers(seed)
    counted = {"steps": 0, "preemptions": 0, "front_stored": 0}
    while sched.has_requests() or workers.stores or workers.loads:
        scheduled = sched.schedule()
        ids = list(scheduled.num_scheduled_tokens)
        states = sched.requests
        sampled = [[7] if states[rid].num_computed_tokens >= states[rid].num_tokens else [] for rid in ids]
        fields: dict[str, Any] = {"req_ids": ids, "sampled_token_ids": sampled}
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # 0.32 and 0.33
            fields["req_id_to_index"] = {rid: index for index, rid in enumerate(ids)}
        fields["kv_connector_output"] = workers.output(counted["steps"], scheduled)
        sched.update_from_output(scheduled, ModelRunnerOutput(**fields))
        counted["preemptions"] += len(scheduled.preempted_req_ids or ())
        counted["front_stored"] += front_stored(sched)
        counted["steps"] += 1
        if counted["steps"] > MAX_STEPS:
            raise AssertionError(f"the scheduler did not finish the workload in {MAX_STEPS:,} steps")
    return sched, {**counted, **workers.issued}


def front_stored(sched: Any) -> int:
    """How many cached blocks sit in the free queue ahead of an uncached one (freed to the front
    once stored: the blocks the order check lets through)."""
    queue = sched.kv_cache_manager.block_pool.free_block_queue
    block = queue.fake_free_list_head.next_free_block
    cached_seen = ahead = 0
    while block is not None and block is not queue.fake_free_list_tail:
        if block.block_hash is not None:
            cached_seen += 1
        else:
            ahead = cached_seen
        block = block.next_free_block
    return ahead


# -- the broken shapes --------------------------------------------------------------------------


def broken_connector(name: str) -> type:
    """`SimpleCPUOffloadConnector` whose scheduler side is broken as `name` says."""
    from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import SimpleCPUOffloadConnector
    from vllm.v1.simple_kv_offload.manager import SimpleCPUOffloadScheduler

    class StoreUnpinned(SimpleCPUOffloadScheduler):  # type: ignore[misc]
        def _prepare_lazy_store_specs(self) -> Any:
            gpu_ids, cpu_ids, reqs, meta = super()._prepare_lazy_store_specs()
            pool = self._gpu_block_pool
            pool.free_blocks(pool.blocks[block] for block in gpu_ids)  # the hold taken for the copy, dropped
            return gpu_ids, cpu_ids, reqs, meta

        def _process_store_completion(self, gpu_block_ids: list[int], *args: Any) -> None:
            pool = self._gpu_block_pool
            pool.touch([pool.blocks[block] for block in gpu_block_ids])  # so the completion's free balances
            super()._process_store_completion(gpu_block_ids, *args)

    class LoadUnpinned(SimpleCPUOffloadScheduler):  # type: ignore[misc]
        def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
            super().update_state_after_alloc(request, blocks, num_external_tokens)
            state = self._reqs_to_load.get(request.request_id)
            if state is not None:
                pool = self._gpu_block_pool
                pool.free_blocks(pool.blocks[block] for block in state.transfer_meta.gpu_block_ids)
                self._unpinned = getattr(self, "_unpinned", set()) | {request.request_id}

        def _cleanup_load_request(self, req_id: str) -> int:
            state = self._reqs_to_load.get(req_id) or self._abandoned_reqs_to_load.get(req_id)
            if state is not None and req_id in getattr(self, "_unpinned", set()):
                pool = self._gpu_block_pool
                pool.touch([pool.blocks[block] for block in state.transfer_meta.gpu_block_ids])
            return int(super()._cleanup_load_request(req_id))

    class KeyedBeforeStored(SimpleCPUOffloadScheduler):  # type: ignore[misc]
        def _prepare_lazy_store_specs(self) -> Any:
            gpu_ids, cpu_ids, reqs, meta = super()._prepare_lazy_store_specs()
            for gpu, cpu in zip(gpu_ids, cpu_ids, strict=True):
                key = self._gpu_block_pool.blocks[gpu].block_hash
                self.cpu_block_pool._insert_block_hash(key, self.cpu_block_pool.blocks[cpu], None)
            return gpu_ids, cpu_ids, reqs, meta

    scheduler_class = {
        "store_unpinned": StoreUnpinned,
        "load_unpinned": LoadUnpinned,
        "keyed_before_stored": KeyedBeforeStored,
    }[name]

    class Broken(SimpleCPUOffloadConnector):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.scheduler_manager is not None:
                self.scheduler_manager.__class__ = scheduler_class

    Broken.__name__ = Broken.__qualname__ = f"Broken_{name}"
    return Broken


BROKEN: dict[str, tuple[bool, str, str]] = {  # name: (lazy, the check, the pool)
    "store_unpinned": (True, "copy_in_flight", "device"),
    "load_unpinned": (False, "refcount", "device"),
    "keyed_before_stored": (True, "copy_in_flight", "host"),
}


def register_broken() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    module = sys.modules[__name__]
    for name in BROKEN:
        cls = broken_connector(name)
        setattr(module, cls.__name__, cls)
        if cls.__name__ not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector(cls.__name__, __name__, cls.__name__)


def silent(lazy: bool) -> dict[str, Any]:
    sched, counted = run(multi([offload(lazy)]))
    connector = sched.connector
    if connector.findings:
        raise AssertionError(f"findings on the stock connector: {connector.findings[:3]}")
    if not counted["stored_blocks"] or not counted["loaded_blocks"]:
        raise AssertionError(f"the workload must store and load: {counted}")
    from kvsched.integrations.vllm.names import require_names

    if lazy and require_names().evict_first and not counted["front_stored"]:
        raise AssertionError("lazy mode must free stored blocks to the queue's front (evict_first)")
    return {"mode": "lazy" if lazy else "eager", **counted, "checks": connector.checking.steps, "findings": 0}


def plain_checker_reports() -> dict[str, Any]:
    import logging

    logger = logging.getLogger("kvsched.integrations.vllm.checker")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # a thousand findings, counted below rather than logged
    try:
        sched, counted = run(multi([offload(True), PLAIN_CHECKER], checking=False))
    finally:
        logger.setLevel(level)
    checker = sched.connector._connectors[1]
    checks = sorted({finding.check for finding in checker.findings})
    if not checks:
        raise AssertionError("the plain checker beside the lazy tier reported nothing: it cannot see its copies")
    return {"plain_checker_reports": checks, "findings": len(checker.findings), **counted}


def order_needs_the_stores() -> dict[str, Any]:
    """On a release that frees stored blocks to the front: the checker, told of no store, must
    report `free_order` on the stock lazy tier (the allowance is what keeps it silent)."""
    from unittest import mock

    from kvsched.integrations.vllm.live import LiveChecker, LiveFinding

    with mock.patch.object(LiveChecker, "_remember_stores", lambda self, *args: None):
        try:
            run(multi([offload(True)]))
        except LiveFinding as error:
            checks = sorted({finding.check for finding in error.findings})
            if checks != ["free_order"]:
                raise AssertionError(f"told of no store, the checker found {checks}, not free_order alone") from error
            return {"told_of_no_store": checks, "first": str(error.findings[0])}
    raise AssertionError("told of no store, the checker found nothing: the lazy tier freed nothing to the front")


def caught(name: str) -> dict[str, Any]:
    from kvsched.integrations.vllm.live import LiveFinding

    lazy, check, pool = BROKEN[name]
    try:
        run(multi([offload(lazy, f"Broken_{name}", __name__)]))
    except LiveFinding as error:
        named = sorted({(finding.check, finding.pool) for finding in error.findings})
        if (check, pool) not in named:
            raise AssertionError(f"{name}: caught by {named}, not by {check} on the {pool} pool") from error
        return {"broken": name, "caught_by": [f"{c} ({p})" for c, p in named], "first": str(error.findings[0])}
    raise AssertionError(f"{name}: the checker found nothing")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    register_broken()
    results: dict[str, Any] = {"stock": [], "broken": []}
    for lazy in (False, True):
        row = silent(lazy)
        print(f"stock {row['mode']}: {row}", file=sys.stderr)
        results["stock"].append(row)
    results["plain_checker"] = plain_checker_reports()
    print(f"plain checker in vLLM's MultiConnector: {results['plain_checker']}", file=sys.stderr)
    from kvsched.integrations.vllm.names import require_names

    if require_names().evict_first:
        results["order_needs_the_stores"] = order_needs_the_stores()
        print(f"the order check told of no store: {results['order_needs_the_stores']}", file=sys.stderr)
    for name in BROKEN:
        row = caught(name)
        print(f"{name}: {row}", file=sys.stderr)
        results["broken"].append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=2)
    return 0


Checks = Callable[[], dict[str, Any]]

if __name__ == "__main__":
    raise SystemExit(main())
