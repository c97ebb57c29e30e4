"""Checks that need a real GPU: realistic shapes against the oracle, and the HBM bandwidth bench.

They skip, saying why, everywhere else; `tests/kernels/gpu_check.sh` runs them (and the CUDA
kernel tests, natively) on a GPU machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched.kernels import paged_attention
from kvsched.kernels.bench_gpu import measure_gpu
from tests.kernels.kernel_batches import appended, kv_rows, ragged_batch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_attention_at_serving_sizes_matches_oracle(dtype: Any, group: int) -> None:
    rng = np.random.default_rng(group)
    batch = ragged_batch(
        rng,
        requests=8,
        q_heads=8 * group,
        kv_heads=8,
        head_dim=128,
        page_size=16,
        dtype=dtype,
        min_context=1,
        max_context=3000,
        chunk=2,
    )
    expected = paged_attention(*batch.attention_args(), scale=batch.scale, device="numpy")
    got = paged_attention(*batch.attention_args(), scale=batch.scale, device="cuda")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_append_at_serving_sizes_matches_oracle() -> None:
    rng = np.random.default_rng(9)
    batch = ragged_batch(
        rng,
        requests=64,
        q_heads=8,
        kv_heads=8,
        head_dim=128,
        page_size=16,
        dtype=np.float16,
        max_context=2000,
        share_prefix=False,
    )
    k, v = kv_rows(rng, batch)
    assert appended(batch, k, v, "cuda") == appended(batch, k, v, "numpy")


def test_decode_bandwidth_is_measured_against_hbm_peak() -> None:
    result = measure_gpu(requests=64, context=4096, repeats=10, peak_gbps=4800.0, seed=0)
    assert "skipped" not in result, result
    assert result["max_abs_error_first_two"] < 1e-4
    assert 0.0 < result["fraction_of_hbm_peak"] <= 1.0
    print(f"\nGPU decode attention: {result['gbps']:.0f} GB/s = {result['fraction_of_hbm_peak']:.0%} of HBM peak")
