"""Checks that need a real GPU: realistic shapes against the oracle, and the HBM bandwidth bench.

They skip, saying why, everywhere else; `tests/kernels/gpu_check.sh` runs them (and the CUDA
kernel tests, natively) on a GPU machine.
"""

from __future__ import annotations

import time
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


def _host(array: Any) -> Any:
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_tier_copies_at_serving_sizes_cross_the_bus_both_ways(dtype: Any) -> None:
    from kvsched.kernels import copy_tier
    from kvsched.kernels.device import cuda

    rng = np.random.default_rng(11)
    layers, device_pages, host_pages, moved, page = 4, 2048, 1024, 256, (16, 8, 128)
    device_tier = [rng.standard_normal((layers, device_pages, *page)).astype(dtype) for _ in range(2)]
    host = [rng.standard_normal((layers, host_pages, *page)).astype(dtype) for _ in range(2)]
    host_tier: tuple[Any, Any] = (host[0], host[1])
    on_gpu: tuple[Any, Any] = (cuda.to_device(device_tier[0]), cuda.to_device(device_tier[1]))
    down = np.stack([rng.permutation(device_pages)[:moved], rng.permutation(host_pages)[:moved]], axis=1)
    up = np.stack([rng.permutation(host_pages)[:moved], rng.permutation(device_pages)[:moved]], axis=1)
    megabytes = moved * 2 * layers * int(np.prod(page)) * np.dtype(dtype).itemsize / 1e6
    for name, source, destination, pairs in (
        ("device -> host", on_gpu, host_tier, down),
        ("host -> device", host_tier, on_gpu, up),
    ):
        expected = (_host(destination[0]).copy(), _host(destination[1]).copy())
        copy_tier((_host(source[0]), _host(source[1])), expected, pairs, device="numpy")
        copy_tier(source, destination, pairs[:1], device="cuda")  # compiles; rewritten below
        cuda.synchronize()
        started = time.perf_counter()
        copy_tier(source, destination, pairs, device="cuda")
        cuda.synchronize()
        seconds = time.perf_counter() - started
        rate = megabytes / seconds / 1e3
        print(f"\n{name}: {moved} pages, {megabytes:.0f} MB in {seconds * 1e3:.1f} ms ({rate:.1f} GB/s)")
        for got, want in zip(destination, expected, strict=True):
            np.testing.assert_array_equal(_host(got), want)
