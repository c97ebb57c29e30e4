"""Random ragged batches over a shared paged cache: the factory every kernel test draws from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.kernels import INVALID_BLOCK, append_kv


@dataclass
class Batch:
    """One paged-attention call's inputs (and what an append at the last positions needs)."""

    q: npt.NDArray[np.float32]  # [queries, q_heads, head_dim] float32
    k_cache: npt.NDArray[Any]  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: npt.NDArray[Any]  # [pages, page_size, kv_heads, head_dim] float16 | float32
    block_table: npt.NDArray[np.uint32]  # [entries] uint32
    table_offsets: npt.NDArray[np.int32]  # [queries] int32
    context_lens: npt.NDArray[np.int32]  # [queries] int32
    table_lengths: npt.NDArray[np.int32]  # [queries] int32
    scale: float

    def attention_args(self) -> tuple[Any, ...]:
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.table_offsets, self.context_lens)


def ragged_batch(
    rng: np.random.Generator,
    *,
    requests: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: Any,
    max_context: int,
    min_context: int = 1,
    chunk: int = 1,
    spare_pages: int = 3,
    share_prefix: bool = True,
) -> Batch:
    """`requests` requests with random context lengths in [min_context, max_context], each table padded
    with INVALID_BLOCK entries past its context; with `chunk` > 1 each request contributes up to
    `chunk` causal queries (context lengths L - chunk + 1 .. L), as a chunk of prefill does.
    Physical pages are shuffled, and a request may share its first page with the one before it,
    as requests attached to one prefix do."""
    contexts = rng.integers(min_context, max_context + 1, size=requests)
    needed = (contexts + page_size - 1) // page_size
    logical_pages = int(needed.max()) + 1
    pages = int(needed.sum()) + spare_pages
    physical = rng.permutation(pages).astype(np.uint32)
    table = np.full(requests * logical_pages, INVALID_BLOCK, dtype=np.uint32)
    offsets: list[int] = []
    lens: list[int] = []
    used = 0
    for request, (context, count) in enumerate(zip(contexts.tolist(), needed.tolist(), strict=True)):
        base = request * logical_pages
        table[base : base + count] = physical[used : used + count]
        used += count
        if share_prefix and request and rng.random() < 0.3:
            table[base] = table[base - logical_pages]
        for length in range(max(1, context - chunk + 1), context + 1):
            offsets.append(base)
            lens.append(length)
    queries = len(lens)
    shape = (pages, page_size, kv_heads, head_dim)
    return Batch(
        q=rng.standard_normal((queries, q_heads, head_dim)).astype(np.float32),
        k_cache=rng.standard_normal(shape).astype(dtype),
        v_cache=rng.standard_normal(shape).astype(dtype),
        block_table=table,
        table_offsets=np.array(offsets, dtype=np.int32),
        context_lens=np.array(lens, dtype=np.int32),
        table_lengths=np.full(queries, logical_pages, dtype=np.int32),
        scale=1.0 / float(np.sqrt(head_dim)),
    )


def kv_rows(rng: np.random.Generator, batch: Batch) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Random K and V rows `[queries, kv_heads, head_dim]` float32 to append for `batch`'s queries."""
    shape = (batch.q.shape[0], batch.k_cache.shape[2], batch.k_cache.shape[3])
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def appended(batch: Batch, k: npt.NDArray[Any], v: npt.NDArray[Any], device: str) -> tuple[bytes, bytes]:
    """The bytes of copies of the batch's caches once `k` and `v` are appended on `device` at each
    query's last position."""
    k_cache, v_cache = batch.k_cache.copy(), batch.v_cache.copy()
    positions = batch.context_lens - 1
    append_kv(k, v, k_cache, v_cache, batch.block_table, batch.table_offsets, positions, device=device)
    return k_cache.tobytes(), v_cache.tobytes()
