"""vLLM schedulers that run over `KvschedBlockPool`, for `scheduler_cls`.

    LLM(model, scheduler_cls="kvsched.integrations.vllm.scheduler.KvschedScheduler", ...)

The scheduler is built inside vLLM's engine process, so that is where the pool is installed:
before vLLM's own constructor builds the `KVCacheManager`. `KvschedAsyncScheduler` is the same
over vLLM's asynchronous scheduler (what vLLM picks when `async_scheduling` is on).
"""

from __future__ import annotations

from typing import Any

from kvsched.integrations.vllm import require_tested_vllm

require_tested_vllm()  # without vLLM, or under another release: UnsupportedVllm naming what to install

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402  (after the version check)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from kvsched.integrations.vllm import block_pool  # noqa: E402


def _require_kvsched_pool(scheduler: Any) -> None:
    pool = scheduler.kv_cache_manager.block_pool
    if not isinstance(pool, block_pool.KvschedBlockPool):
        raise TypeError(f"the scheduler's block pool is {type(pool).__qualname__}, not KvschedBlockPool")


class KvschedScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's `Scheduler`, its KV cache manager over kvsched's pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        block_pool.install()
        super().__init__(*args, **kwargs)
        _require_kvsched_pool(self)


class KvschedAsyncScheduler(AsyncScheduler):  # type: ignore[misc]
    """vLLM's `AsyncScheduler`, its KV cache manager over kvsched's pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        block_pool.install()
        super().__init__(*args, **kwargs)
        _require_kvsched_pool(self)
