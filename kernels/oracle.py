"""numpy oracles of the three decode kernels: the definitions the numba twins and CUDA kernels are
tested against.

They favour the obvious over the fast: each query gathers its keys and values position by position
through the block table (see `kvsched.kernels.layout`) and the softmax is computed in float64 with
the maximum subtracted. Inputs are assumed validated (`kvsched.kernels.layout.check_*`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
U32 = npt.NDArray[np.uint32]
Cache = npt.NDArray[np.float16] | npt.NDArray[np.float32]


def gather_positions(
    cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    block_table: U32,  # [entries] uint32
    table_offset: int,
    positions: npt.NDArray[np.int64],  # [n] int64
) -> npt.NDArray[np.float64]:
    """The cache rows of `positions` for one query's table, as float64 `[n, kv_heads, head_dim]`."""
    page_size = cache.shape[1]
    pages = block_table[table_offset + positions // page_size].astype(np.int64)
    rows: npt.NDArray[np.float64] = cache[pages, positions % page_size].astype(np.float64)
    return rows


def paged_attention_oracle(
    q: F32,  # [queries, q_heads, head_dim] float32
    k_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    block_table: U32,  # [entries] uint32
    table_offsets: I32,  # [queries] int32
    context_lens: I32,  # [queries] int32
    scale: float,
    context_starts: I32 | None = None,  # [queries] int32 (None: all 0)
) -> F32:  # [queries, q_heads, head_dim] float32
    """softmax(scale * q k^T) v over positions `[context_start, context_len)`, q head h reading kv
    head h // group."""
    queries, q_heads, head_dim = q.shape
    group = q_heads // k_cache.shape[2]
    out = np.empty((queries, q_heads, head_dim), dtype=np.float32)
    for query in range(queries):
        first = 0 if context_starts is None else int(context_starts[query])
        positions = np.arange(first, int(context_lens[query]), dtype=np.int64)
        keys = gather_positions(k_cache, block_table, int(table_offsets[query]), positions)
        values = gather_positions(v_cache, block_table, int(table_offsets[query]), positions)
        keys = np.repeat(keys, group, axis=1)  # [n, q_heads, head_dim]
        values = np.repeat(values, group, axis=1)
        scores = np.einsum("hd,nhd->hn", q[query].astype(np.float64), keys) * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[query] = np.einsum("hn,nhd->hd", weights, values)
    return out


def append_kv_oracle(
    k: F32,  # [queries, kv_heads, head_dim] float32
    v: F32,  # [queries, kv_heads, head_dim] float32
    k_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    v_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    block_table: U32,  # [entries] uint32
    table_offsets: I32,  # [queries] int32
    positions: I32,  # [queries] int32
) -> None:
    """Store each query's K and V row at its position (rounded to the cache dtype)."""
    page_size = k_cache.shape[1]
    for query in range(k.shape[0]):
        position = int(positions[query])
        page = int(block_table[int(table_offsets[query]) + position // page_size])
        k_cache[page, position % page_size] = k[query]
        v_cache[page, position % page_size] = v[query]


def copy_pages_oracle(
    k_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    v_cache: Cache,  # [pages, page_size, kv_heads, head_dim] float16 | float32, written
    pairs: I32,  # [copies, 2] int32 (source, destination)
) -> None:
    """Copy every source page onto its destination, K and V alike."""
    for source, destination in pairs.tolist():
        k_cache[destination] = k_cache[source]
        v_cache[destination] = v_cache[source]


def copy_tier_oracle(source: tuple[Cache, Cache], destination: tuple[Cache, Cache], pairs: I32) -> None:
    """Copy every pair's page from one tier's `[layers, pages, ...]` caches into the other's."""
    for page, target in pairs.tolist():
        destination[0][:, target] = source[0][:, page]
        destination[1][:, target] = source[1][:, page]
