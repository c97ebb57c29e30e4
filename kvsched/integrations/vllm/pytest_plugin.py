"""`pytest -p kvsched.integrations.vllm.pytest_plugin`: vLLM's own tests over `KvschedBlockPool`.

Before collection, vLLM's `BlockPool` is rebound (where its managers build it and where its
tests import it), so the tests run unmodified. `KVSCHED_VLLM_RESERVE=MODULE:CLASS` puts another
reserve under the pool (how `make vllm` shows the tests catch a wrong one);
`KVSCHED_VLLM_DEBUG=1` checks every view against the reserve after every call.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from kvsched.integrations.vllm import block_pool

    block_pool.install()


def pytest_report_header(config: pytest.Config) -> str:
    from kvsched.integrations.vllm import block_pool

    pool = block_pool.KvschedBlockPool
    reserve = pool.reserve_class
    name = f"{reserve.__module__}.{reserve.__qualname__}"
    return f"kvsched: vLLM's BlockPool is KvschedBlockPool over {name} (debug {pool.debug})"
