"""KV events for routers: what an engine publishes about its cache, and the index that folds it.

    from kvsched.events import RouterIndex, EventBatch

    index = RouterIndex()
    verdict = index.fold("engine-0", batch)   # FOLDED, GAP, RESTARTED, ... (`Verdict`)
    engine, pages = index.route(prompt_keys)  # the engine holding the longest prefix

`RouterIndex` is impl's (`kvsched.impl.router_index`), checked in lockstep against the spec's
(`kvsched.spec.router_index`); the events, batches, snapshots and vLLM's encoding are
`kvsched.spec.kv_events`'s.
"""

from kvsched.impl.router_index import RouterIndex
from kvsched.spec.kv_events import (
    DEVICE,
    HOST,
    Cleared,
    EventBatch,
    Removed,
    Snapshot,
    Stored,
    fold_events,
    from_vllm,
    to_vllm,
)
from kvsched.spec.router_index import Verdict

__all__ = [
    "DEVICE",
    "HOST",
    "Cleared",
    "EventBatch",
    "Removed",
    "RouterIndex",
    "Snapshot",
    "Stored",
    "Verdict",
    "fold_events",
    "from_vllm",
    "to_vllm",
]
