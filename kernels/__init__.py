"""The decode path: paged-attention, KV-append and page-copy kernels on three devices, and the
small transformer whose decode and prefill backends run through them.

    paged_attention(q, k_cache, v_cache, block_table, table_offsets, context_lens, scale=, device=)
    append_kv(k, v, k_cache, v_cache, block_table, table_offsets, positions, device=)
    copy_pages(k_cache, v_cache, pairs, device=)

`device` is "numpy" (the oracle), "cpu" (the numba twin) or "cuda" (numba-cuda; the simulator
under NUMBA_ENABLE_CUDASIM=1). Each module holds one concept: `layout` (the page table and the
pre-launch checks), `oracle`, `twins`, `cuda_attention`, `cuda_cache`, `ops` (the dispatch),
`ptx` (the register/spill report) and `bench`.
"""

from kvsched.kernels.layout import INVALID_BLOCK, MAX_GROUP, MAX_HEAD_DIM
from kvsched.kernels.ops import DEVICES, Device, append_kv, check_device, copy_pages, paged_attention

__all__ = [
    "DEVICES",
    "INVALID_BLOCK",
    "MAX_GROUP",
    "MAX_HEAD_DIM",
    "Device",
    "append_kv",
    "check_device",
    "copy_pages",
    "paged_attention",
]
