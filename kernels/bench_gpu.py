"""The decode-attention kernel's throughput on a native GPU: GB/s of K+V read by the kernel alone
(caches resident on the device, timed with CUDA events over repeated launches), as a fraction of
the HBM peak. `kvsched.kernels.bench --gpu` reports it; elsewhere it says why it was skipped."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.kernels import ops
from kvsched.kernels.bench import DecodeShape, decode_batch, kv_bytes
from kvsched.kernels.layout import check_attention


def measure_gpu(requests: int, context: int, repeats: int, peak_gbps: float, seed: int) -> dict[str, Any]:
    """Kernel-only GB/s on a native GPU (caches resident, timed with CUDA events), or why not."""
    from kvsched.kernels.device import SIMULATED, cuda, has_native_gpu

    if SIMULATED or not has_native_gpu():
        return {"skipped": "no native GPU (numba.cuda.is_available() is False or the simulator is on)"}
    from kvsched.kernels.cuda_attention import THREADS, paged_attention_kernel

    shape = DecodeShape(requests=requests, min_context=context, max_context=context)
    batch = decode_batch(np.random.default_rng(seed), shape, np.float16)
    scale = np.float32(1.0 / np.sqrt(shape.head_dim))
    expected = ops.paged_attention(
        batch["q"][:2],
        batch["k_cache"],
        batch["v_cache"],
        batch["block_table"],
        batch["table_offsets"][:2],
        batch["context_lens"][:2],
        scale=float(scale),
        device="numpy",
    )
    # The timed launches skip the wrapper (its transfers would dominate), not its checks.
    check_attention(
        batch["q"],
        batch["k_cache"],
        batch["v_cache"],
        batch["block_table"],
        batch["table_offsets"],
        batch["context_lens"],
        float(scale),
    )
    device = {name: cuda.to_device(array) for name, array in batch.items()}
    starts = cuda.to_device(np.zeros(requests, dtype=np.int32))  # full attention: from position 0
    out = cuda.device_array(batch["q"].shape, dtype=np.float32)
    blocks = requests * shape.kv_heads

    def launch() -> None:
        paged_attention_kernel[blocks, THREADS](
            device["q"],
            device["k_cache"],
            device["v_cache"],
            device["block_table"],
            device["table_offsets"],
            device["context_lens"],
            starts,
            scale,
            out,
        )

    launch()
    cuda.synchronize()
    error = float(np.abs(out.copy_to_host()[:2] - expected).max())
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(repeats):
        launch()
    stop.record()
    stop.synchronize()
    seconds = start.elapsed_time(stop) / 1e3 / repeats
    gbps = kv_bytes(batch) / seconds / 1e9
    return {
        "device": _device_name(cuda.get_current_device()),
        "requests": requests,
        "context": context,
        "cache_dtype": "float16",
        "seconds": seconds,
        "gbps": gbps,
        "fraction_of_hbm_peak": gbps / peak_gbps,
        "hbm_peak_gbps": peak_gbps,
        "max_abs_error_first_two": error,
    }


def _device_name(device: Any) -> str:
    name = getattr(device, "name", "unknown GPU")
    return name.decode() if isinstance(name, bytes) else str(name)
