"""The public decode-path operations, each on one of three devices.

- `"numpy"`: the oracle (`kvsched.kernels.oracle`), the definition the others are tested against;
- `"cpu"`: the numba-CPU twin (`kvsched.kernels.twins`);
- `"cuda"`: the numba-cuda kernel (`kvsched.kernels.cuda_attention`, `kvsched.kernels.cuda_cache`),
  on a GPU, or in numba-cuda's simulator when `NUMBA_ENABLE_CUDASIM=1` was set before numba.cuda
  was first imported. Only this device accepts caches that already live on the device.

Every device validates the same way (`kvsched.kernels.layout`) before touching any data, so a
bad table raises the same `ValueError` everywhere and nothing is written or launched.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvsched.kernels import oracle, twins
from kvsched.kernels.jit import parallel_chunksize
from kvsched.kernels.layout import check_append, check_attention, check_copy, check_tier_copy

Device = Literal["numpy", "cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("numpy", "cpu", "cuda")
# paged_attention's array arguments, in order (for callers holding them by name)
ATTENTION_ARGS = ("q", "k_cache", "v_cache", "block_table", "table_offsets", "context_lens")


def check_device(device: str) -> Device:
    """`device` if it names one of `DEVICES`, else `ValueError`."""
    for known in DEVICES:
        if device == known:
            return known
    raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")


def paged_attention(
    q: Any,  # [queries, q_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache
    block_table: Any,  # [entries] uint32, INVALID_BLOCK where unmapped
    table_offsets: Any,  # [queries] integer: where each query's table starts in block_table
    context_lens: Any,  # [queries] integer >= 1: each query attends to positions < its context_len
    *,
    scale: float,
    device: str,
    table_lengths: Any = None,  # [queries] integer: entries each query owns (optional bound)
    context_starts: Any = None,  # [queries] integer: the first position each query reads (a window's)
) -> npt.NDArray[np.float32]:  # [queries, q_heads, head_dim] float32
    """softmax(scale * q K^T) V for every query over its paged context, with grouped-query heads
    (q head h reads kv head h // (q_heads // kv_heads)).

    Decode is one query per request with `context_len = position + 1`; a chunk of prefill is
    several queries sharing one table offset, each with its own `context_len` (causal). A
    sliding window or chunked local attention reads from `context_starts` on (default 0): the
    entries before it are never read, so they may hold the null page.
    Raises `ValueError` naming the query and table entry if any reachable entry is unmapped or
    outside the cache, and on any dtype, shape or contiguity mismatch.
    """
    kind = check_device(device)
    if kind == "cuda":
        from kvsched.kernels.cuda_attention import launch_paged_attention

        return launch_paged_attention(
            q, k_cache, v_cache, block_table, table_offsets, context_lens, scale, table_lengths, context_starts
        )
    _require_host(k_cache, v_cache)
    offsets, lens, starts = check_attention(
        q, k_cache, v_cache, block_table, table_offsets, context_lens, scale, table_lengths, context_starts
    )
    if kind == "numpy":
        return oracle.paged_attention_oracle(q, k_cache, v_cache, block_table, offsets, lens, scale, starts)
    out = np.empty(q.shape, dtype=np.float32)
    if q.shape[0]:
        order = np.argsort(starts.astype(np.int64) - lens, kind="stable")  # longest first: the cores finish together
        with parallel_chunksize(1):
            twins.paged_attention_twin(
                q,
                _numba_view(k_cache),
                _numba_view(v_cache),
                block_table,
                offsets,
                lens,
                starts,
                float(scale),
                order,
                out,
            )
    return out


def append_kv(
    k: Any,  # [queries, kv_heads, head_dim] float32
    v: Any,  # [queries, kv_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, written
    block_table: Any,  # [entries] uint32
    table_offsets: Any,  # [queries] integer
    positions: Any,  # [queries] integer >= 0
    *,
    device: str,
) -> None:
    """Write each query token's K and V at its position's page and row, rounded to the cache dtype.

    Raises `ValueError` (nothing written) on a bad table entry or two queries at one cache row.
    """
    kind = check_device(device)
    if kind == "cuda":
        from kvsched.kernels.cuda_cache import launch_append_kv

        launch_append_kv(k, v, k_cache, v_cache, block_table, table_offsets, positions)
        return
    _require_host(k_cache, v_cache)
    offsets, where = check_append(k, v, k_cache, v_cache, block_table, table_offsets, positions)
    if kind == "numpy":
        oracle.append_kv_oracle(k, v, k_cache, v_cache, block_table, offsets, where)
    elif k.shape[0]:
        twins.append_kv_twin(k, v, _numba_view(k_cache), _numba_view(v_cache), block_table, offsets, where)


def copy_pages(
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] or [layers, pages, ...], written
    v_cache: Any,  # same shape and dtype as k_cache, written
    pairs: Any,  # [copies, 2] integer (source, destination), or a sequence of pairs
    *,
    device: str,
) -> None:
    """Copy each source page onto its destination (in every layer), K and V: copy-on-write.

    Raises `ValueError` (nothing copied) on a page outside the cache, a self-copy, a destination
    named twice, or a page that is both a source and a destination.
    """
    kind = check_device(device)
    if kind == "cuda":
        from kvsched.kernels.cuda_cache import launch_copy_pages

        launch_copy_pages(k_cache, v_cache, pairs)
        return
    _require_host(k_cache, v_cache)
    table = check_copy(k_cache, v_cache, pairs)
    layered = k_cache.ndim == 5
    for layer in range(k_cache.shape[0] if layered else 1):
        k_layer = k_cache[layer] if layered else k_cache
        v_layer = v_cache[layer] if layered else v_cache
        if kind == "numpy":
            oracle.copy_pages_oracle(k_layer, v_layer, table)
        elif table.shape[0]:
            twins.copy_pages_twin(_numba_view(k_layer), _numba_view(v_layer), table)


def copy_tier(
    source: tuple[Any, Any],  # K and V of the tier read, [layers, pages, page_size, kv_heads, head_dim]
    destination: tuple[Any, Any],  # K and V of the tier written (another page count), written
    pairs: Any,  # [copies, 2] integer (source page, destination page), or a sequence of pairs
    *,
    device: str,
) -> None:
    """Copy each pair's page from one tier into the other (device to host or back), every layer,
    K and V. On "cuda" one kernel launch does it (a host tier's arrays cross the bus); on "cpu"
    its twin; on "numpy" the oracle. Raises `ValueError` (nothing copied) on a page outside its
    tier, a destination named twice, or tiers whose pages differ in shape or dtype."""
    kind = check_device(device)
    if kind == "cuda":
        from kvsched.kernels.cuda_cache import launch_copy_tier

        launch_copy_tier(source, destination, pairs)
        return
    _require_host(*source, *destination)
    table = check_tier_copy(source, destination, pairs)
    if kind == "numpy":
        oracle.copy_tier_oracle(source, destination, table)
    elif table.shape[0]:
        views = [_numba_view(cache) for cache in (*source, *destination)]
        twins.copy_tier_twin(views[0], views[1], views[2], views[3], table)


def _require_host(*caches: Any) -> None:
    for cache in caches:
        if not isinstance(cache, np.ndarray):
            raise ValueError(f"devices numpy and cpu need host (numpy) caches, got {type(cache).__name__}")


def _numba_view(cache: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """numba's CPU target has no float16: hand it the same memory as uint16 bits."""
    return cache.view(np.uint16) if cache.dtype == np.float16 else cache
