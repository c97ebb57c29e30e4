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
blocks are allocated. There the checker reads what the step changed in the manager and its pool,
in place (`kvsched.integrations.vllm.live_delta`), and the whole pool, into a
`kvsched.integrations.vllm.live.PoolView`, at the first step, every `kvsched_whole_every` steps
(64 by default; 1: every step) and at once when the step's reading is off: `LiveChecker`'s checks
(reference counts, free queue, its order, the hash map, ghost content by key, salts, finished
requests, stale keys), and at every step each scheduled request's pass in a sliding-window or
chunked group against the blocks its queries read (`window_read`), and in a Mamba group in
"align" mode against the blocks it resumes and leaves its state in (`state_read`). A finding raises
`LiveFinding` ("raise", the default) or is logged and counted in `findings` ("log"). With KV
events on (`kv_events_config`), it also folds every event the pool published, read in place
from its queue, and requires them to count exactly the blocks its hash map names (`kv_events`). It loads
nothing from outside (no KV, no matched tokens), defers no free and needs no hand-off delivered, so
vLLM schedules as without it. Its role is `kv_producer`: a consumer role with overlapping batches
(async scheduling) makes vLLM's scheduler defer block frees in a queue of its own, which a connector
cannot see, and the checker refuses it.

Importing this module without vLLM, or under a release the integration is not tested with, raises
`UnsupportedVllm` naming what to install; under a tested release whose names differ from
`kvsched.integrations.vllm.names`, it raises listing them. The free queue's order it checks is
every release's own: an uncached block is never behind a cached one.

Beside other connectors, name `KvschedMultiConnector` where vLLM's `MultiConnector` would be
named, with the same `connectors` list: it is vLLM's MultiConnector, and after its connectors
have built each step's metadata it checks the pool, counting the references a connector holds
for its copies in flight. vLLM's CPU-offloading connector (`SimpleCPUOffloadConnector`, eager or
lazy) is read: its stores and loads in flight, on the device pool and on its own host pool
(checked as well, with no tables: only its references). In lazy mode (0.34) a completed store
frees its blocks to the queue's front (`evict_first`): the checker saw each store in flight and
lets those blocks sit anywhere while they keep the key stored. A connector whose references the
checker cannot read is refused: its checks would report them.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvschedMultiConnector",
        "kv_connector_module_path": "kvsched.integrations.vllm.checker", "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "SimpleCPUOffloadConnector",
            "kv_role": "kv_both", "kv_connector_extra_config": {"lazy_offload": true}}]}}'
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from vllm.v1.core.single_type_kv_cache_manager import (  # noqa: E402
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)

from kvsched.integrations.vllm.events import EventWatch, translate  # noqa: E402
from kvsched.integrations.vllm.hash_map import read_hash_map  # noqa: E402
from kvsched.integrations.vllm.live import (  # noqa: E402
    Finding,
    Held,
    LiveChecker,
    LiveFinding,
    Pass,
    PoolView,
    StatePass,
    state_findings,
    window_findings,
)
from kvsched.integrations.vllm.live_delta import WHOLE_EVERY, DeltaChecker  # noqa: E402
from kvsched.spec.kv_layout import Chunked, Group, Window  # noqa: E402

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


@dataclass(slots=True)
class Copies:
    """What connectors have in flight on one pool: their references (block -> how many), the
    blocks their stores read, the blocks their copies write."""

    pinned: Counter[int] = field(default_factory=Counter)
    storing: list[int] = field(default_factory=list)
    writing: list[int] = field(default_factory=list)


def offload_copies(manager: Any) -> tuple[Copies, Copies]:
    """The copies the scheduler side of vLLM's `SimpleCPUOffloadConnector` has in flight, on the
    device pool and on its host pool: every store (issued, abandoned by a reset, or queued at a
    request's finish) and every load (issued or abandoned) holds one reference on each of its
    device and host blocks, and each cache hit awaiting its load one on each host block it found."""
    device, host = Copies(), Copies()
    stores = [
        *manager._store_event_to_blocks.values(),
        *manager._abandoned_store_event_to_blocks.values(),
        *manager._pending_finished_stores,
    ]
    loading = (*manager._reqs_to_load.values(), *manager._abandoned_reqs_to_load.values())
    loads = [state.transfer_meta for state in loading]
    for transfer in stores:
        device.pinned.update(transfer.gpu_block_ids)
        device.storing += transfer.gpu_block_ids
        host.pinned.update(transfer.cpu_block_ids)
        host.writing += transfer.cpu_block_ids
    for transfer in loads:
        device.pinned.update(transfer.gpu_block_ids)
        device.writing += transfer.gpu_block_ids
        host.pinned.update(transfer.cpu_block_ids)
    for found, _, _ in manager._pending_cpu_hits.values():
        host.pinned.update(block.block_id for group in found for block in group if not block.is_null)
    return device, host


def published_hash(block_hash: Any, group: int) -> tuple[Any, int]:
    """A block hash as vLLM's KV events name it (whole, or its low 64 bits), with its group."""
    return block_hash, group


def published_key(key: bytes) -> tuple[Any, int]:
    """A hash map key (a block hash and its group id) as vLLM's KV events name it."""
    return maybe_convert_block_hash(get_block_hash(key)), get_group_id(key)


def read_view(manager: Any, requests: dict[str, Any], copies: Copies | None = None) -> PoolView:
    """vLLM's manager and pool as a `PoolView`; `requests` maps the live requests' ids to them,
    `copies` says what connectors have in flight on the pool."""
    held = [
        read_held(single, request_id, table, requests, manager.block_pool.hash_block_size)
        for single in manager.coordinator.single_type_managers
        for request_id, table in single.req_to_blocks.items()
    ]
    return read_pool(manager.block_pool, tuple(held), copies or Copies())


def read_held(
    single: Any, request_id: str, table: Sequence[Any], requests: dict[str, Any], hash_block_size: int
) -> Held:
    """One request's table in one of vLLM's single-type managers, as the checker reads it."""
    group = single.kv_cache_group_id
    request = requests.get(request_id)
    keyed = single.block_size == hash_block_size  # else its keys are not one per block
    return Held(
        request_id=request_id,
        group=group,
        blocks=tuple(map(BLOCK_ID, table)),
        cached=single.num_cached_block.get(request_id, 0),
        keys=GroupKeys(request.block_hashes, group) if request is not None and keyed else (),
        tokens=() if request is None else request.all_token_ids,
        block_size=single.block_size,
        salt=None if request is None else (request.cache_salt, getattr(request.lora_request, "lora_int_id", 0)),
        masked=bounded_group(single) is not None,
    )


def bounded_group(single: Any) -> Group | None:
    """A single-type manager's group when its queries read a bounded range: a sliding window or
    chunked local attention (None for the others: full attention reads everything before it)."""
    if isinstance(single, SlidingWindowManager):
        return Window(single.sliding_window)
    if isinstance(single, ChunkedLocalAttentionManager):
        return Chunked(single.attention_chunk_size)
    return None


def state_passes(manager: Any, requests: Mapping[str, Any], scheduled: Mapping[str, int]) -> list[StatePass]:
    """This step's passes in the manager's recurrent groups whose states sit at block boundaries
    (a `MambaManager` in "align" mode without speculative blocks, whose worker keeps the running
    state in the block holding the last computed position): each request `scheduled` names, from
    its computed tokens, with its table's blocks where it resumes and leaves its state."""
    passes = []
    for single in manager.coordinator.single_type_managers:
        if not isinstance(single, MambaManager) or single.mamba_cache_mode != "align" or single.num_speculative_blocks:
            continue
        size, tables = single.block_size, single.req_to_blocks
        for request_id, tokens in scheduled.items():
            request, table = requests.get(request_id), tables.get(request_id, ())
            if request is None or not tokens:
                continue
            step = StatePass(request_id, single.kv_cache_group_id, size, request.num_computed_tokens, tokens, {})
            blocks = {index: BLOCK_ID(table[index]) for index, _ in step.places if index < len(table)}
            passes.append(replace(step, blocks=blocks))
    return passes


def read_passes(manager: Any, requests: Mapping[str, Any], scheduled: Mapping[str, int]) -> list[Pass]:
    """This step's passes in the manager's sliding-window and chunked groups: each request
    `scheduled` names (id -> the tokens it computes, drafts included), from its computed tokens
    (read before the scheduler counts this step's), over the blocks of its table they reach, none
    read below its `replay_start` (after a prefix hit, vLLM may replay a window's last tokens to
    rebuild its KV, which the request holds from there on only)."""
    passes = []
    for single in manager.coordinator.single_type_managers:
        group = bounded_group(single)
        if group is None:
            continue
        size, tables = single.block_size, single.req_to_blocks
        for request_id, tokens in scheduled.items():
            request, table = requests.get(request_id), tables.get(request_id, ())
            if request is None or not tokens:
                continue  # (every request scheduled was announced to the connector first)
            position, start = request.num_computed_tokens, request.replay_start
            step = Pass(request_id, single.kv_cache_group_id, group, size, position, tokens, (), len(table), start)
            passes.append(replace(step, blocks=tuple(map(BLOCK_ID, table[step.first : step.end]))))
    return passes


class InPlace:
    """vLLM's manager and pool read in place, block by block (a `live_delta.LivePool`): what the
    checker reads of a step between its whole checks. A table of a group other than full
    attention is read as a copy (a sliding window's changes in place: skipped blocks become the
    null block), so each step compares it whole."""

    def __init__(self, manager: Any, requests: dict[str, Any], copies: Copies) -> None:
        pool = manager.block_pool
        self.manager, self.requests, self.copies = manager, requests, copies
        self.blocks = pool.blocks
        self.null_block: int = pool.null_block.block_id
        queue = pool.free_block_queue
        self.head, self.tail = queue.fake_free_list_head, queue.fake_free_list_tail
        self.free_count: int = queue.num_free_blocks
        self.extra = pool.cached_block_hashes_by_block
        self.cache_map = read_hash_map(pool.cached_block_hash_to_block, RELEASE.map_of_ids)
        self.pinned, self.storing, self.writing = copies.pinned, copies.storing, copies.writing

    def ref_count(self, block: int) -> int:
        return int(self.blocks[block].ref_cnt)

    def key(self, block: int) -> bytes | None:
        return KEY(self.blocks[block])  # type: ignore[no-any-return]

    def carried(self, block: int) -> tuple[bytes, ...]:
        key, extra = KEY(self.blocks[block]), self.extra.get(block)
        if not extra:
            return () if key is None else (key,)
        return tuple(extra) if key is None else (key, *extra)

    def queue_links(self, block: int) -> tuple[int | None, int | None] | None:
        entry = self.blocks[block]
        before = entry.prev_free_block
        if before is None:
            return None
        after = entry.next_free_block
        return (
            None if before is self.head else before.block_id,
            None if after is self.tail or after is None else after.block_id,
        )

    def groups(self) -> Iterator[tuple[int, Mapping[str, Sequence[object]], Mapping[str, int]]]:
        for single in self.manager.coordinator.single_type_managers:
            tables = single.req_to_blocks
            if not isinstance(single, FullAttentionManager):
                tables = {request_id: tuple(table) for request_id, table in tables.items()}
            yield single.kv_cache_group_id, tables, single.num_cached_block

    def block_of(self, entry: object) -> int:
        return BLOCK_ID(entry)  # type: ignore[no-any-return]

    def held_by(self, request_id: str, group: int) -> Held:
        single = self.manager.coordinator.single_type_managers[group]
        table = single.req_to_blocks[request_id]
        return read_held(single, request_id, table, self.requests, self.manager.block_pool.hash_block_size)

    def whole(self) -> PoolView:
        return read_view(self.manager, self.requests, self.copies)

    def published(self, key: bytes) -> Hashable:
        return published_key(key)


def read_pool(pool: Any, held: tuple[Held, ...], copies: Copies) -> PoolView:
    """One of vLLM's `BlockPool`s as a `PoolView`, with the tables and copies that hold its blocks."""
    blocks = pool.blocks
    return PoolView(
        ref_counts=list(map(REF_COUNT, blocks)),
        null_block=pool.null_block.block_id,
        free_queue=free_queue(pool.free_block_queue, len(blocks)),
        free_count=pool.free_block_queue.num_free_blocks,
        keys=list(map(KEY, blocks)),
        extra_keys=pool.cached_block_hashes_by_block,
        cache_map=read_hash_map(pool.cached_block_hash_to_block, RELEASE.map_of_ids),
        held=held,
        pinned=copies.pinned,
        storing=copies.storing,
        writing=copies.writing,
    )


@dataclass(slots=True)
class Checking:
    """The live checker's state across steps, for either connector: the requests it knows, its
    checker on the device pool and one on each host pool beside it, what it found."""

    on_finding: str
    delta: DeltaChecker = field(default_factory=DeltaChecker)
    hosts: dict[int, LiveChecker] = field(default_factory=dict)
    requests: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    steps: int = 0
    watch: EventWatch = field(default_factory=EventWatch)  # the pool's KV events, when it publishes them

    @classmethod
    def configured(cls, transfer_config: Any) -> Checking:
        extra = transfer_config.kv_connector_extra_config or {}
        on_finding = str(extra.get("kvsched_on_finding", "raise"))
        if on_finding not in ON_FINDING:
            raise ValueError(f"kvsched_on_finding must be one of {ON_FINDING}, not {on_finding!r}")
        every = extra.get("kvsched_whole_every", WHOLE_EVERY)
        if type(every) is not int or every < 1:
            raise ValueError(f"kvsched_whole_every must be a whole number of steps >= 1, not {every!r}")
        return cls(on_finding, DeltaChecker(every))

    @property
    def checker(self) -> LiveChecker:
        return self.delta.checker

    def added(self, request: Any) -> None:
        self.requests[request.request_id] = request
        self.delta.request_added(request.request_id)

    def finished(self, request: Any) -> None:
        self.delta.request_finished(request.request_id)
        self.requests.pop(request.request_id, None)

    def check(
        self, manager: Any, offloaders: Iterable[Any] = (), scheduled: Mapping[str, int] | None = None
    ) -> list[Finding]:
        """Check `manager`'s pool, and the host pool of each of `offloaders` (vLLM's
        `SimpleCPUOffloadConnector`s beside it), and this step's passes in its sliding-window and
        chunked groups (`scheduled`: the scheduler output's tokens by request); what was found
        (raised, or logged and kept)."""
        self.steps += 1
        device, hosts = Copies(), []
        for offloader in offloaders:
            tier = offloader.scheduler_manager  # None on the worker's side
            if tier is None:
                continue
            on_device, on_host = offload_copies(tier)
            device.pinned.update(on_device.pinned)
            device.storing += on_device.storing
            device.writing += on_device.writing
            hosts.append((id(offloader), tier.cpu_block_pool, on_host))
        pool = manager.block_pool
        events = translate(self.watch.new(pool), published_hash) if pool.enable_kv_cache_events else None
        findings = self.delta.check(InPlace(manager, self.requests, device), events)
        if scheduled:
            null = pool.null_block.block_id
            findings += window_findings(read_passes(manager, self.requests, scheduled), null)
            findings += state_findings(state_passes(manager, self.requests, scheduled), null)
        for key, pool, copies in hosts:
            host = self.hosts.setdefault(key, LiveChecker())
            found = host.check(read_pool(pool, (), copies))
            findings += [Finding(f.check, f.request_id, f.block_id, f.detail, "host") for f in found]
        if findings:
            self.findings += findings
            if self.on_finding == "raise":
                raise LiveFinding(findings)
            for finding in findings:
                logger.error("kvsched live checker, step %d: %s", self.steps, finding)
        return findings


class KvschedChecker(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """A scheduler-side KV connector that checks vLLM's pool at every step; see the module. It
    supports vLLM's hybrid KV cache manager (`SupportsHMA`): a connector that does not turns it
    off, and a hybrid model then runs, unchecked, on one full-attention group."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.checking = Checking.configured(self._kv_transfer_config)
        if self._kv_transfer_config.is_kv_consumer and vllm_config.max_concurrent_batches > 1:
            raise ValueError(
                f"kv_role {self._kv_transfer_config.kv_role!r} with overlapping batches makes vLLM defer block frees"
                " in the scheduler, where a connector cannot see them: give the checker kv_role 'kv_producer'"
            )

    @property
    def findings(self) -> list[Finding]:
        return self.checking.findings

    @property
    def checker(self) -> LiveChecker:
        return self.checking.checker

    @property
    def steps(self) -> int:
        return self.checking.steps

    # -- the scheduler's side ------------------------------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # it hands no KV off: a preempted request's in-flight output is kept, as without it

    def on_new_request(self, request: Any) -> None:
        self.checking.added(request)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False  # it loads nothing

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.checking.requests.setdefault(request.request_id, request)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self.check(scheduler_output.num_scheduled_tokens)
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.checking.finished(request)
        return False, None  # its blocks are freed now, as without a connector

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.checking.finished(request)
        return False, None  # (the hybrid manager's call: every group's blocks freed now)

    def check(self, scheduled: Mapping[str, int] | None = None) -> list[Finding]:
        """Check the bound manager's pool now, and the passes `scheduled` names (request -> its
        tokens this step); what was found (raised, or logged and kept)."""
        manager = self._kv_cache_manager
        return [] if manager is None else self.checking.check(manager, scheduled=scheduled)

    # -- the worker's side: nothing to load or save ----------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def _offloader_class() -> type:
    from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import SimpleCPUOffloadConnector

    offloader: type = SimpleCPUOffloadConnector
    return offloader


class KvschedMultiConnector(MultiConnector):  # type: ignore[misc]
    """vLLM's `MultiConnector`, checking the pool after its connectors at every step; see the
    module. Its connectors are vLLM's CPU-offloading connectors, whose copies it reads."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.checking = Checking.configured(vllm_config.kv_transfer_config)
        offloader = _offloader_class()
        self.offloaders = [c for c in self._connectors if isinstance(c, offloader)]
        if self.offloaders:
            from kvsched.integrations.vllm.names import require_copies_names

            require_copies_names()
        unread = [type(c).__name__ for c in self._connectors if not isinstance(c, offloader)]
        if unread:
            raise ValueError(
                f"KvschedMultiConnector cannot read which blocks {', '.join(unread)} holds, so its checks would"
                " report them: it runs SimpleCPUOffloadConnector (and checks by itself: list no KvschedChecker)"
            )

    @property
    def findings(self) -> list[Finding]:
        return self.checking.findings

    def on_new_request(self, request: Any) -> None:
        super().on_new_request(request)
        self.checking.added(request)

    def request_finished(self, request: Any, blocks: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.checking.finished(request)
        return super().request_finished(request, blocks)  # type: ignore[no-any-return]

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.checking.finished(request)
        return super().request_finished_all_groups(request, block_ids)  # type: ignore[no-any-return]

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        metadata = super().build_connector_meta(scheduler_output)  # the offloaders' copies issued first
        if self._kv_cache_manager is not None:
            self.checking.check(self._kv_cache_manager, self.offloaders, scheduler_output.num_scheduled_tokens)
        return metadata

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._kv_cache_manager = kv_cache_manager


__all__ = [
    "Checking",
    "Copies",
    "KvschedChecker",
    "KvschedMultiConnector",
    "LiveFinding",
    "offload_copies",
    "read_pool",
    "read_view",
]
