"""Paged attention as a numba-cuda kernel: one block per (query, kv head), tiles of TILE tokens.

A block serves the `group = q_heads // kv_heads` query heads that share one kv head, so each K and V
element is read from global memory once per block. It walks the query's context in tiles:

    stage      K and V rows of TILE positions -> shared memory (float32), page by page via the table
    score      scores[g, t] = (scale * q[g]) . K[t]            one (head, token) pair per thread slot
    normalise  per head g: new running max, probs = exp(score - max), running sum, rescale factor
    accumulate acc[g, d] = acc[g, d] * rescale[g] + sum_t probs[g, t] * V[t, d]

(an online softmax: the running maximum and sum are rescaled at every tile, so no score is ever
exponentiated unshifted and the context length is unbounded). Between phases the block waits on a
barrier; the tile loop's trip count depends only on the block's query, so every barrier is reached
by all threads. No warp shuffles are used, so the CUDA simulator runs the same code.

Keys and values are staged in rows padded to MAX_HEAD_DIM + 1 floats: in the score phase the 32
threads of a warp read 32 different tokens at the same dimension, and the odd row stride puts
them in 32 different banks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvsched.kernels.device import cuda, float32, jit, kernel_options, on_device
from kvsched.kernels.layout import MAX_GROUP, MAX_HEAD_DIM, check_attention

THREADS = 128  # threads per block: a power of two, a multiple of 32, and >= MAX_GROUP
TILE = 32  # positions staged per step; MAX_GROUP * TILE must be a multiple of THREADS
ROW = MAX_HEAD_DIM + 1  # padded shared row (see the module docstring)
OUTPUTS_PER_THREAD = MAX_GROUP * MAX_HEAD_DIM // THREADS  # (head, dim) accumulators each thread owns
SCORES_PER_THREAD = MAX_GROUP * TILE // THREADS  # (head, token) scores each thread computes per tile
# Shared memory is ~38 KiB a block, so 5 blocks fit an SM's 228 KiB. Asking for 4 resident blocks
# caps registers at 128 a thread; left alone ptxas took 148, and the register file then fits 3.
MIN_BLOCKS_PER_SM = 4
LAUNCH_BOUNDS = (THREADS, MIN_BLOCKS_PER_SM)

assert THREADS % 32 == 0 and THREADS >= MAX_GROUP
assert (MAX_GROUP * MAX_HEAD_DIM) % THREADS == 0 and (MAX_GROUP * TILE) % THREADS == 0


@jit(device=True)
def stage_tile(
    cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    block_table: Any,  # [entries] uint32
    table_offset: int,
    kv_head: int,
    start: int,
    context_len: int,
    tile: Any,  # [TILE, ROW] float32 shared, written
) -> None:
    """Copy the rows of positions `start .. start + TILE` (those inside the context) into `tile`;
    consecutive threads take consecutive dimensions, so each row is one coalesced read."""
    page_size = cache.shape[1]
    head_dim = cache.shape[3]
    for element in range(cuda.threadIdx.x, TILE * head_dim, THREADS):
        token = element // head_dim
        d = element - token * head_dim
        position = start + token
        if position < context_len:
            logical = position // page_size
            page = block_table[table_offset + logical]
            tile[token, d] = float32(cache[page, position - logical * page_size, kv_head, d])


@jit(device=True)
def score_tile(
    q_tile: Any,  # [MAX_GROUP, MAX_HEAD_DIM] float32 shared, q already scaled
    k_tile: Any,  # [TILE, ROW] float32 shared
    group: int,
    head_dim: int,
    valid: int,
    probs: Any,  # [MAX_GROUP, TILE] float32 shared, written with raw scores (-inf past the context)
) -> None:
    """One dot product per (head, token) slot; a warp covers the TILE tokens of one head."""
    for slot in range(SCORES_PER_THREAD):
        pair = cuda.threadIdx.x + slot * THREADS
        g = pair // TILE
        token = pair - g * TILE
        if g < group:
            score = float32(-math.inf)
            if token < valid:
                score = float32(0.0)
                for d in range(head_dim):
                    score += q_tile[g, d] * k_tile[token, d]
            probs[g, token] = score


@jit(device=True)
def normalise_tile(
    probs: Any,  # [MAX_GROUP, TILE] float32 shared: scores in, unnormalised probabilities out
    stats: Any,  # [3, MAX_GROUP] float32 shared: running max, running sum, this tile's rescale
    g: int,
    valid: int,
) -> None:
    """Fold one tile into head `g`'s running softmax statistics (one thread per head)."""
    previous = stats[0, g]
    tile_max = previous
    for token in range(valid):
        tile_max = max(tile_max, probs[g, token])
    total = float32(0.0)
    for token in range(valid):
        weight = math.exp(probs[g, token] - tile_max)
        probs[g, token] = weight
        total += weight
    # The first tile has previous = -inf and a finite tile_max (it holds at least one position), so
    # the rescale is exp(-inf) = 0 and the empty accumulators stay empty.
    rescale = math.exp(previous - tile_max)
    stats[0, g] = tile_max
    stats[1, g] = stats[1, g] * rescale + total
    stats[2, g] = rescale


@jit(device=True)
def accumulate_tile(
    acc: Any,  # [OUTPUTS_PER_THREAD] float32 local
    probs: Any,  # [MAX_GROUP, TILE] float32 shared
    stats: Any,  # [3, MAX_GROUP] float32 shared
    v_tile: Any,  # [TILE, ROW] float32 shared
    group: int,
    head_dim: int,
    valid: int,
) -> None:
    """Rescale this thread's accumulators and add the tile's probability-weighted values."""
    for slot in range(OUTPUTS_PER_THREAD):
        pair = cuda.threadIdx.x + slot * THREADS
        g = pair // head_dim
        if g < group:
            d = pair - g * head_dim
            total = acc[slot] * stats[2, g]
            for token in range(valid):
                total += probs[g, token] * v_tile[token, d]
            acc[slot] = total


@jit(**kernel_options(LAUNCH_BOUNDS))
def paged_attention_kernel(
    q: Any,  # [queries, q_heads, head_dim] float32
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache
    block_table: Any,  # [entries] uint32, every reachable entry validated < pages
    table_offsets: Any,  # [queries] int32
    context_lens: Any,  # [queries] int32, >= 1
    context_starts: Any,  # [queries] int32, below context_lens: the first position each reads
    scale: float,
    out: Any,  # [queries, q_heads, head_dim] float32, written
) -> None:
    """Attention of every query head in one GQA group (blockIdx.x = query * kv_heads + kv_head)."""
    kv_heads = k_cache.shape[2]
    if cuda.blockIdx.x >= q.shape[0] * kv_heads:
        return
    query = cuda.blockIdx.x // kv_heads
    kv_head = cuda.blockIdx.x - query * kv_heads
    head_dim = q.shape[2]
    group = q.shape[1] // kv_heads
    tid = cuda.threadIdx.x
    context_len = context_lens[query]
    table_offset = table_offsets[query]

    q_tile = cuda.shared.array((MAX_GROUP, MAX_HEAD_DIM), float32)
    k_tile = cuda.shared.array((TILE, ROW), float32)
    v_tile = cuda.shared.array((TILE, ROW), float32)
    probs = cuda.shared.array((MAX_GROUP, TILE), float32)
    stats = cuda.shared.array((3, MAX_GROUP), float32)
    acc = cuda.local.array(OUTPUTS_PER_THREAD, float32)

    for element in range(tid, group * head_dim, THREADS):
        g = element // head_dim
        d = element - g * head_dim
        q_tile[g, d] = q[query, kv_head * group + g, d] * float32(scale)
    if tid < group:
        stats[0, tid] = -math.inf
        stats[1, tid] = 0.0
    for slot in range(OUTPUTS_PER_THREAD):
        acc[slot] = 0.0

    for start in range(context_starts[query], context_len, TILE):
        valid = min(TILE, context_len - start)
        cuda.syncthreads()  # the previous tile's readers are done (and q_tile/stats are set)
        stage_tile(k_cache, block_table, table_offset, kv_head, start, context_len, k_tile)
        stage_tile(v_cache, block_table, table_offset, kv_head, start, context_len, v_tile)
        cuda.syncthreads()
        score_tile(q_tile, k_tile, group, head_dim, valid, probs)
        cuda.syncthreads()
        if tid < group:
            normalise_tile(probs, stats, tid, valid)
        cuda.syncthreads()
        accumulate_tile(acc, probs, stats, v_tile, group, head_dim, valid)

    for slot in range(OUTPUTS_PER_THREAD):
        pair = tid + slot * THREADS
        g = pair // head_dim
        if g < group:
            d = pair - g * head_dim
            out[query, kv_head * group + g, d] = acc[slot] / stats[1, g]


def launch_paged_attention(
    q: Any,  # [queries, q_heads, head_dim] float32, host
    k_cache: Any,  # [pages, page_size, kv_heads, head_dim] float16 | float32, host or device
    v_cache: Any,  # [pages, page_size, kv_heads, head_dim] same dtype as k_cache, host or device
    block_table: Any,  # [entries] uint32, host
    table_offsets: Any,  # [queries] integer, host
    context_lens: Any,  # [queries] integer >= 1, host
    scale: float,
    table_lengths: Any = None,  # [queries] integer, host, or None
    context_starts: Any = None,  # [queries] integer, host, or None (all 0)
) -> np.ndarray[Any, np.dtype[np.float32]]:  # [queries, q_heads, head_dim] float32, host
    """Validate, move the small per-round inputs to the device, launch, and copy the output back.

    Caches already on the device stay there (that is where a serving loop keeps them); host caches
    are copied up for this call. Raises `ValueError` before any transfer or launch on a bad input.
    """
    offsets, lens, starts = check_attention(
        q, k_cache, v_cache, block_table, table_offsets, context_lens, scale, table_lengths, context_starts
    )
    queries, q_heads, head_dim = q.shape
    out = np.empty((queries, q_heads, head_dim), dtype=np.float32)
    if queries == 0:
        return out
    threads_per_block = THREADS
    blocks_per_grid = queries * int(k_cache.shape[2])
    device_out = cuda.device_array_like(out)
    paged_attention_kernel[blocks_per_grid, threads_per_block](
        cuda.to_device(q),
        on_device(k_cache),
        on_device(v_cache),
        cuda.to_device(block_table),
        cuda.to_device(offsets),
        cuda.to_device(lens),
        cuda.to_device(starts),
        np.float32(scale),
        device_out,
    )
    device_out.copy_to_host(out)
    return out
