"""The decoder-only transformer's shape: one frozen, validated value shared by its weights, the
dense reference forward and the paged backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsched.kernels.layout import CACHE_DTYPES, MAX_GROUP, MAX_HEAD_DIM

U32_LIMIT = 2**32 - 1  # token ids travel as uint32 in the batch ABI


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A small Llama-shaped model: RMSNorm, rotary positions, grouped-query attention through the
    paged KV cache, a SwiGLU MLP, untied embedding and output matrices, greedy decoding.

    The defaults are a toy size that runs in the CUDA simulator; `hidden` need not equal
    `q_heads * head_dim` (the projections map between them). `sliding_window` gives each layer the
    positions its queries read back (a query at position i reads i - window + 1 .. i; 0: every
    earlier one), as gpt-oss and Gemma 3 alternate sliding-window and full layers; empty: every
    layer full.
    """

    layers: int = 2
    hidden: int = 32
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    mlp_hidden: int = 64
    vocab: int = 61
    page_size: int = 4
    cache_dtype: str = "float32"  # "float16" or "float32": K and V are rounded to it when stored
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    sliding_window: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "mlp_hidden", "vocab", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.q_heads % self.kv_heads or self.q_heads // self.kv_heads > MAX_GROUP:
            raise ValueError(
                f"q_heads ({self.q_heads}) must be kv_heads ({self.kv_heads}) times 1..{MAX_GROUP} (the GQA group)"
            )
        if self.head_dim > MAX_HEAD_DIM or self.head_dim % 2:
            raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM} (rotary pairs), got {self.head_dim}")
        if self.vocab > U32_LIMIT:
            raise ValueError(f"vocab must fit token ids in uint32, got {self.vocab}")
        if self.cache_dtype not in {str(dtype) for dtype in CACHE_DTYPES}:
            raise ValueError(f"cache_dtype must be 'float16' or 'float32', got {self.cache_dtype!r}")
        windows = self.sliding_window
        if not isinstance(windows, tuple) or (windows and len(windows) != self.layers):
            raise ValueError(f"sliding_window must be a tuple of one window a layer ({self.layers}), got {windows!r}")
        for window in windows:
            if not isinstance(window, int) or isinstance(window, bool) or window < 0:
                raise ValueError(f"a layer's sliding window must be an int >= 0 (0: full), got {window!r}")
        for name in ("rope_theta", "rms_eps"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")

    def window(self, layer: int) -> int:
        """The positions layer `layer`'s queries read back (0: every earlier one)."""
        return self.sliding_window[layer] if self.sliding_window else 0

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.q_heads // self.kv_heads

    @property
    def cache_numpy_dtype(self) -> np.dtype[Any]:
        """The KV cache element type."""
        return np.dtype(self.cache_dtype)

    @property
    def scale(self) -> float:
        """The attention logit scale, 1 / sqrt(head_dim)."""
        return 1.0 / float(np.sqrt(self.head_dim))

    def cache_shape(self, pages: int) -> tuple[int, int, int, int, int]:
        """`[layers, pages, page_size, kv_heads, head_dim]`: one K (or V) cache for all layers."""
        return (self.layers, pages, self.page_size, self.kv_heads, self.head_dim)
