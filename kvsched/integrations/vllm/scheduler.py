"""vLLM schedulers that run over `KvschedBlockPool`, for `scheduler_cls`.

    LLM(model, scheduler_cls="kvsched.integrations.vllm.scheduler.KvschedScheduler", ...)
    vllm serve MODEL --scheduler-cls kvsched.integrations.vllm.scheduler.KvschedScheduler

The scheduler is built inside vLLM's engine process. While vLLM's own constructor runs, the
name `KVCacheManager` it builds its manager by is `KvschedKVCacheManager`, whose coordinator's
pool is a `KvschedBlockPool`; both names are vLLM's own again once the constructor returns, and
nothing else vLLM builds meanwhile (the CPU-offload tier's pool, made by the coordinator factory
from the KV connector) is substituted. `KvschedAsyncScheduler` is the same over vLLM's
asynchronous scheduler (what vLLM picks when `async_scheduling` is on).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from kvsched.integrations.vllm import require_tested_vllm

require_tested_vllm()  # without vLLM, or under another release: UnsupportedVllm naming what to install

import vllm.v1.core.sched.scheduler as vllm_scheduler  # noqa: E402  (after the version check)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402

from kvsched.integrations.vllm import block_pool  # noqa: E402  (checks every name it uses)


@contextlib.contextmanager
def _managers_substituted() -> Iterator[None]:
    before = vllm_scheduler.KVCacheManager
    vllm_scheduler.KVCacheManager = block_pool.KvschedKVCacheManager
    try:
        yield
    finally:
        vllm_scheduler.KVCacheManager = before


logger = logging.getLogger("vllm.kvsched")  # under vLLM's logger: its handlers and level apply


def _require_kvsched_pool(scheduler: Any) -> None:
    pool = scheduler.kv_cache_manager.block_pool
    if not isinstance(pool, block_pool.KvschedBlockPool):
        raise TypeError(f"the scheduler's block pool is {type(pool).__qualname__}, not KvschedBlockPool")
    reserve = type(pool.reserve)
    logger.info(
        "kvsched: %s over KvschedBlockPool (%d blocks, reserve %s.%s, vLLM %s)",
        type(scheduler).__qualname__,
        len(pool.blocks),
        reserve.__module__,
        reserve.__qualname__,
        block_pool.RELEASE.version,
    )


class KvschedScheduler(vllm_scheduler.Scheduler):  # type: ignore[misc]
    """vLLM's `Scheduler`, its KV cache manager over kvsched's pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _managers_substituted():
            super().__init__(*args, **kwargs)
        _require_kvsched_pool(self)


class KvschedAsyncScheduler(AsyncScheduler):  # type: ignore[misc]
    """vLLM's `AsyncScheduler`, its KV cache manager over kvsched's pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _managers_substituted():
            super().__init__(*args, **kwargs)
        _require_kvsched_pool(self)
