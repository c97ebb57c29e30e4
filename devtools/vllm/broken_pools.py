"""A vLLM scheduler over a deliberately broken `BlockPool`, for `vllm serve --scheduler-cls`: what a
wrong pool does to the tokens a server returns (`serve.py`).

    vllm serve MODEL --scheduler-cls broken_pools.KeyOutlivesScheduler     (this folder on PYTHONPATH)

`KeyOutlivesScheduler` is vLLM's `Scheduler` whose pool hands a cached block out keeping its hash
and drops the stale hash just before caching the block again (`kvsched check`'s `key_outlives`:
vLLM #49449's class), so a later prompt that hits the hash reads KV its new owner wrote. Only
the scheduler's own pool is broken; nothing else vLLM builds is.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import vllm.v1.core.sched.scheduler as vllm_scheduler

from kvsched.testing.adapters.vllm import key_outlives_class


class KeyOutlivesScheduler(vllm_scheduler.Scheduler):  # type: ignore[misc]
    """vLLM's `Scheduler` over `key_outlives_class()`'s pool (must not serve stock's tokens)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with mock.patch("vllm.v1.core.kv_cache_coordinator.BlockPool", key_outlives_class()):
            super().__init__(*args, **kwargs)
