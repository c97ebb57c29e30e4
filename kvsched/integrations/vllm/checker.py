"""A live checker for vLLM's KV pool, through vLLM's own KV connector seam (no monkeypatching).

    LLM(model, kv_transfer_config=KVTransferConfig(
        kv_connector="KvschedChecker",
        kv_connector_module_path="kvsched.integrations.vllm.checker",
        kv_role="kv_producer",
        kv_connector_extra_config={"kvsched_on_finding": "raise"},   # or "log"
    ))
    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvschedChecker",
        "kv_connector_module_path": "kvsched.integrations.vllm.checker", "kv_role": "kv_producer"}'

vLLM's scheduler hands a connector its live `KVCacheManager` (`bind_kv_cache_manager`), tells it
of every new request (`on_new_request`) and every finished one (`request_finished`, before its
blocks are freed), and calls `build_connector_meta` once per `schedule()`, after the step's
blocks are allocated. There the checker reads the manager and its pool into a
`kvsched.integrations.vllm.live.PoolView` and runs `LiveChecker`'s checks (reference counts, free
queue, its order, the hash map, ghost content by key, salts, finished requests). A finding raises
`LiveFinding` ("raise", the default) or is logged and counted in `findings` ("log"). It loads
nothing from outside (no KV, no matched tokens), defers no free and needs no hand-off delivered, so
vLLM schedules as without it. Its role is `kv_producer`: a consumer role with overlapping batches
(async scheduling) makes vLLM's scheduler defer block frees in a queue of its own, which a connector
cannot see, and the checker refuses it.

Importing this module without vLLM, or under a release the integration is not tested with, raises
`UnsupportedVllm` naming what to install; under a tested release whose names differ from
`kvsched.integrations.vllm.names`, it raises listing them. The free queue's order it checks is
every release's own when no tier frees to the eviction end: an uncached block is never behind a
cached one. vLLM 0.34's CPU-offload tier frees cached blocks to the front (`evict_first`); the
checker is then one connector of several, and its order check would report those blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, overload

from kvsched.integrations.vllm import require_tested_vllm

require_tested_vllm()  # without vLLM, or under another release: UnsupportedVllm naming what to install

from kvsched.integrations.vllm.names import require_names  # noqa: E402

RELEASE = require_names()  # every name below is where this release has it, or UnsupportedVllm

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402  (after the version check)
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id  # noqa: E402

from kvsched.integrations.vllm.hash_map import read_hash_map  # noqa: E402
from kvsched.integrations.vllm.live import Finding, Held, LiveChecker, LiveFinding, PoolView  # noqa: E402

logger = logging.getLogger(__name__)
ON_FINDING = ("raise", "log")
# What the checker reads of each `KVCacheBlock` (its key: the field behind 0.32 and 0.33's
# `block_hash` property, 0.34's plain field).
BLOCK_ID, REF_COUNT, KEY = attrgetter("block_id"), attrgetter("ref_cnt"), attrgetter(RELEASE.block_key)


class GroupKeys(Sequence[bytes]):
    """A request's block keys in one cache group, as the pool keys them, made when read."""

    def __init__(self, hashes: Sequence[bytes], group: int) -> None:
        self.hashes = hashes
        self.group = group

    def __len__(self) -> int:
        return len(self.hashes)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [bytes(make_block_hash_with_group_id(key, self.group)) for key in self.hashes[index]]
        return bytes(make_block_hash_with_group_id(self.hashes[index], self.group))


def free_queue(queue: Any, bound: int) -> tuple[int, ...]:
    """The free queue's blocks head to tail, as its links say; at most `bound` + 1 of them (a
    cycle, which a block queued twice can make, stops there)."""
    blocks: list[int] = []
    block = queue.fake_free_list_head.next_free_block
    while block is not None and block is not queue.fake_free_list_tail and len(blocks) <= bound:
        blocks.append(block.block_id)
        block = block.next_free_block
    return tuple(blocks)


def read_view(manager: Any, requests: dict[str, Any]) -> PoolView:
    """vLLM's manager and pool as a `PoolView`; `requests` maps the live requests' ids to them."""
    pool = manager.block_pool
    blocks = pool.blocks
    held = []
    for single in manager.coordinator.single_type_managers:
        group = single.kv_cache_group_id
        keyed = single.block_size == pool.hash_block_size  # else its keys are not one per block
        for request_id, table in single.req_to_blocks.items():
            request = requests.get(request_id)
            salt = None if request is None else (request.cache_salt, getattr(request.lora_request, "lora_int_id", 0))
            held.append(
                Held(
                    request_id=request_id,
                    group=group,
                    blocks=tuple(map(BLOCK_ID, table)),
                    cached=single.num_cached_block.get(request_id, 0),
                    keys=GroupKeys(request.block_hashes, group) if request is not None and keyed else (),
                    tokens=() if request is None else request.all_token_ids,
                    block_size=single.block_size,
                    salt=salt,
                )
            )
    return PoolView(
        ref_counts=list(map(REF_COUNT, blocks)),
        null_block=pool.null_block.block_id,
        free_queue=free_queue(pool.free_block_queue, len(blocks)),
        free_count=pool.free_block_queue.num_free_blocks,
        keys=list(map(KEY, blocks)),
        extra_keys=pool.cached_block_hashes_by_block,
        cache_map=read_hash_map(pool.cached_block_hash_to_block, RELEASE.map_of_ids),
        held=tuple(held),
    )


class KvschedChecker(KVConnectorBase_V1):  # type: ignore[misc]
    """A scheduler-side KV connector that checks vLLM's pool at every step; see the module."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.on_finding = str(extra.get("kvsched_on_finding", "raise"))
        if self.on_finding not in ON_FINDING:
            raise ValueError(f"kvsched_on_finding must be one of {ON_FINDING}, not {self.on_finding!r}")
        if self._kv_transfer_config.is_kv_consumer and vllm_config.max_concurrent_batches > 1:
            raise ValueError(
                f"kv_role {self._kv_transfer_config.kv_role!r} with overlapping batches makes vLLM defer block frees"
                " in the scheduler, where a connector cannot see them: give the checker kv_role 'kv_producer'"
            )
        self.checker = LiveChecker()
        self.requests: dict[str, Any] = {}
        self.findings: list[Finding] = []
        self.steps = 0

    # -- the scheduler's side ------------------------------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # it hands no KV off: a preempted request's in-flight output is kept, as without it

    def on_new_request(self, request: Any) -> None:
        self.requests[request.request_id] = request
        self.checker.request_added(request.request_id)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False  # it loads nothing

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.requests.setdefault(request.request_id, request)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self.check()
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.checker.request_finished(request.request_id)
        self.requests.pop(request.request_id, None)
        return False, None  # its blocks are freed now, as without a connector

    def check(self) -> list[Finding]:
        """Check the bound manager's pool now; what was found (raised, or logged and kept)."""
        manager = self._kv_cache_manager
        if manager is None:
            return []
        self.steps += 1
        findings = self.checker.check(read_view(manager, self.requests))
        if findings:
            self.findings += findings
            if self.on_finding == "raise":
                raise LiveFinding(findings)
            for finding in findings:
                logger.error("kvsched live checker, step %d: %s", self.steps, finding)
        return findings

    # -- the worker's side: nothing to load or save ----------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


__all__ = ["KvschedChecker", "LiveFinding", "read_view"]
