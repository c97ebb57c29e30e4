"""The decode path: paged-attention, KV-append and page-copy kernels on three devices, and the
small transformer whose decode and prefill backends run through them.

    paged_attention(q, k_cache, v_cache, block_table, table_offsets, context_lens, scale=, device=)
    append_kv(k, v, k_cache, v_cache, block_table, table_offsets, positions, device=)
    copy_pages(k_cache, v_cache, pairs, device=)

    PagedBackend(init_weights(ModelConfig(...), seed), pages, device)   the decode/prefill backend

`device` is "numpy" (the oracle), "cpu" (the numba twin) or "cuda" (numba-cuda; the simulator
under NUMBA_ENABLE_CUDASIM=1). One concept per module: `layout` (the page table and the
pre-launch checks), `oracle`, `twins`, `cuda_attention`, `cuda_cache`, `ops` (the dispatch),
`ptx` (the register/spill report), `bench`; and for the model `config`, `weights` (with
`safetensors_io`), `model` (the dense arithmetic and reference forward) and `backend`.
"""

from kvsched.kernels.backend import PagedBackend
from kvsched.kernels.config import ModelConfig
from kvsched.kernels.layout import INVALID_BLOCK, MAX_GROUP, MAX_HEAD_DIM
from kvsched.kernels.model import Transformer, greedy_reference, reference_logits
from kvsched.kernels.ops import DEVICES, Device, append_kv, check_device, copy_pages, copy_tier, paged_attention
from kvsched.kernels.weights import Weights, init_weights, load_npz, load_safetensors, save_npz, save_safetensors

__all__ = [
    "DEVICES",
    "INVALID_BLOCK",
    "MAX_GROUP",
    "MAX_HEAD_DIM",
    "Device",
    "ModelConfig",
    "PagedBackend",
    "Transformer",
    "Weights",
    "append_kv",
    "check_device",
    "copy_pages",
    "copy_tier",
    "greedy_reference",
    "init_weights",
    "load_npz",
    "load_safetensors",
    "paged_attention",
    "reference_logits",
    "save_npz",
    "save_safetensors",
]
