"""The model's parameters: deterministic seeded initialisation, and loading/saving as `.npz` or
safetensors under these names (`i` is the layer; matrices multiply row vectors, `x @ W`):

    embed.weight                  [vocab, hidden]
    layers.{i}.attn_norm.weight   [hidden]
    layers.{i}.attn.wq            [hidden, q_heads * head_dim]
    layers.{i}.attn.wk            [hidden, kv_heads * head_dim]
    layers.{i}.attn.wv            [hidden, kv_heads * head_dim]
    layers.{i}.attn.wo            [q_heads * head_dim, hidden]
    layers.{i}.mlp_norm.weight    [hidden]
    layers.{i}.mlp.w_gate         [hidden, mlp_hidden]
    layers.{i}.mlp.w_up           [hidden, mlp_hidden]
    layers.{i}.mlp.w_down         [mlp_hidden, hidden]
    final_norm.weight             [hidden]
    lm_head.weight                [hidden, vocab]

Head h of a projection is columns `h * head_dim .. (h + 1) * head_dim`. Every tensor is held as
float32 whatever it was stored as; loading checks that exactly these names are present with
exactly these shapes for the given config, and raises `ValueError` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.kernels import safetensors_io
from kvsched.kernels.config import ModelConfig

F32 = npt.NDArray[np.float32]


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the config needs, with its shape."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (c.vocab, c.hidden)}
    for i in range(c.layers):
        shapes |= {
            f"layers.{i}.attn_norm.weight": (c.hidden,),
            f"layers.{i}.attn.wq": (c.hidden, c.q_heads * c.head_dim),
            f"layers.{i}.attn.wk": (c.hidden, c.kv_heads * c.head_dim),
            f"layers.{i}.attn.wv": (c.hidden, c.kv_heads * c.head_dim),
            f"layers.{i}.attn.wo": (c.q_heads * c.head_dim, c.hidden),
            f"layers.{i}.mlp_norm.weight": (c.hidden,),
            f"layers.{i}.mlp.w_gate": (c.hidden, c.mlp_hidden),
            f"layers.{i}.mlp.w_up": (c.hidden, c.mlp_hidden),
            f"layers.{i}.mlp.w_down": (c.mlp_hidden, c.hidden),
        }
    shapes |= {"final_norm.weight": (c.hidden,), "lm_head.weight": (c.hidden, c.vocab)}
    return shapes


@dataclass(frozen=True)
class Weights:
    """A config and its float32 tensors, checked against each other at construction."""

    config: ModelConfig
    tensors: Mapping[str, F32]

    def __post_init__(self) -> None:
        shapes = expected_shapes(self.config)
        missing = sorted(set(shapes) - set(self.tensors))
        extra = sorted(set(self.tensors) - set(shapes))
        if missing or extra:
            raise ValueError(f"weights do not match the config: missing {missing[:4]}, unexpected {extra[:4]}")
        for name, shape in shapes.items():
            tensor = self.tensors[name]
            if tensor.shape != shape or tensor.dtype != np.float32:
                raise ValueError(f"{name} is {tensor.dtype} {tensor.shape}, expected float32 {shape}")
            if not np.isfinite(tensor).all():
                raise ValueError(f"{name} holds a non-finite value")

    def __getitem__(self, name: str) -> F32:
        return self.tensors[name]

    def layer(self, index: int, name: str) -> F32:
        """`layers.{index}.{name}`."""
        return self.tensors[f"layers.{index}.{name}"]


def init_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """Deterministic weights for `seed`: N(0, 1/fan_in) matrices (activations keep unit scale
    through the layers), norm gains near 1. The same config and seed give the same bits anywhere."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, F32] = {}
    for name, shape in expected_shapes(config).items():  # insertion order fixes the draw order
        if len(shape) == 1:
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            fan_in = shape[1] if name == "embed.weight" else shape[0]
            values = rng.standard_normal(shape) / np.sqrt(fan_in)
        tensors[name] = values.astype(np.float32)
    return Weights(config, tensors)


def save_npz(weights: Weights, path: str | Path) -> None:
    """Write the tensors to an uncompressed `.npz` under their documented names."""
    arrays: dict[str, Any] = dict(weights.tensors)
    np.savez(Path(path), allow_pickle=False, **arrays)


def load_npz(config: ModelConfig, path: str | Path) -> Weights:
    """Read weights for `config` from `.npz`."""
    with np.load(Path(path), allow_pickle=False) as archive:
        return Weights(config, {name: _as_float32(name, archive[name]) for name in archive.files})


def save_safetensors(weights: Weights, path: str | Path) -> None:
    """Write the tensors as float32 safetensors, with the config in the metadata."""
    metadata = {field: str(getattr(weights.config, field)) for field in weights.config.__dataclass_fields__}
    safetensors_io.save_file(dict(weights.tensors), path, metadata)


def load_safetensors(config: ModelConfig, path: str | Path) -> Weights:
    """Read weights for `config` from a safetensors file (F32, F16 or BF16 tensors)."""
    tensors, _ = safetensors_io.load_file(path)
    return Weights(config, {name: _as_float32(name, tensor) for name, tensor in tensors.items()})


def _as_float32(name: str, tensor: npt.NDArray[Any]) -> F32:
    if tensor.dtype.kind != "f":
        raise ValueError(f"{name} is {tensor.dtype}, expected a floating-point tensor")
    return np.ascontiguousarray(tensor, dtype=np.float32)
