"""The CUDA kernels against the numpy oracles: in numba-cuda's simulator on a machine without a
GPU (tiny shapes: every simulated thread is Python), natively on a GPU (gpu_check.sh)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched.kernels import append_kv, copy_pages, paged_attention
from tests.kernels.kernel_batches import appended, kv_rows, ragged_batch

pytestmark = pytest.mark.usefixtures("cuda_mode")

# Each case is a few blocks of 128 threads; the simulator spends ~0.1-0.4 ms a thread and 5-10 ms
# a barrier (4 a tile), so contexts stay within two or three 32-position tiles.
ATTENTION_CASES = [
    # (dtype, kv_heads, group, head_dim, page_size, requests, min_context, max_context, chunk)
    (np.float32, 1, 1, 8, 4, 3, 1, 40, 1),  # MHA, partial last pages, one to two tiles
    (np.float16, 2, 2, 8, 3, 2, 33, 40, 1),  # GQA 2, float16, page size not dividing the tile
    (np.float16, 1, 4, 16, 16, 1, 65, 70, 1),  # GQA 4, three tiles, one page per 16 positions
    (np.float32, 1, 2, 8, 4, 1, 30, 36, 3),  # chunked prefill: three causal queries on one table
    (np.float16, 1, 8, 128, 16, 1, 20, 40, 1),  # the limits: GQA 8 x head_dim 128 fills every slot
]
CASE_FIELDS = "dtype, kv_heads, group, head_dim, page_size, requests, min_context, max_context, chunk"


@pytest.mark.parametrize(CASE_FIELDS, ATTENTION_CASES)
def test_attention_kernel_matches_oracle(
    dtype: Any,
    kv_heads: int,
    group: int,
    head_dim: int,
    page_size: int,
    requests: int,
    min_context: int,
    max_context: int,
    chunk: int,
) -> None:
    rng = np.random.default_rng(hash((kv_heads, group, head_dim, page_size)) % 2**32)
    batch = ragged_batch(
        rng,
        requests=requests,
        q_heads=kv_heads * group,
        kv_heads=kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        min_context=min_context,
        max_context=max_context,
        chunk=chunk,
    )
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    got = paged_attention(*batch.attention_args(), scale=batch.scale, device="cuda")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_append_kernel_matches_oracle(dtype: Any) -> None:
    rng = np.random.default_rng(21)
    batch = ragged_batch(
        rng,
        requests=4,
        q_heads=2,
        kv_heads=2,
        head_dim=8,
        page_size=4,
        dtype=dtype,
        max_context=30,
        share_prefix=False,
    )
    k, v = kv_rows(rng, batch)
    k *= 1000.0
    got = appended(batch, k, v, "cuda")
    assert got == appended(batch, k, v, "numpy")
    assert got[0] != batch.k_cache.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_copy_kernel_matches_oracle_in_every_layer(dtype: Any) -> None:
    rng = np.random.default_rng(4)
    shape = (3, 10, 4, 2, 8)  # [layers, pages, page_size, kv_heads, head_dim]
    k_cache = rng.standard_normal(shape).astype(dtype)
    v_cache = rng.standard_normal(shape).astype(dtype)
    pairs = np.array([[0, 5], [0, 6], [9, 1]])
    results = []
    for device in ("numpy", "cuda"):
        k, v = k_cache.copy(), v_cache.copy()
        copy_pages(k, v, pairs, device=device)
        results.append((k, v))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_array_equal(results[1][1], results[0][1])
    np.testing.assert_array_equal(results[1][0][:, 6], k_cache[:, 0])


def test_device_resident_caches_stay_on_the_device() -> None:
    """A serving loop keeps the caches on the GPU: append, copy and attend through device arrays."""
    from kvsched.kernels.device import cuda

    rng = np.random.default_rng(8)
    batch = ragged_batch(
        rng,
        requests=2,
        q_heads=2,
        kv_heads=1,
        head_dim=8,
        page_size=4,
        dtype=np.float16,
        max_context=12,
        share_prefix=False,
    )
    k, v = kv_rows(rng, batch)
    positions = batch.context_lens - 1
    device_k, device_v = cuda.to_device(batch.k_cache), cuda.to_device(batch.v_cache)
    append_kv(k, v, device_k, device_v, batch.block_table, batch.table_offsets, positions, device="cuda")
    append_kv(k, v, batch.k_cache, batch.v_cache, batch.block_table, batch.table_offsets, positions, device="numpy")
    got = paged_attention(
        batch.q,
        device_k,
        device_v,
        batch.block_table,
        batch.table_offsets,
        batch.context_lens,
        scale=batch.scale,
        device="cuda",
    )
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)
    np.testing.assert_array_equal(device_k.copy_to_host(), batch.k_cache)
