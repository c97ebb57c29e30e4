"""The model's config, weights and their files: validation, determinism, round trips."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvsched.kernels import (
    ModelConfig,
    init_weights,
    load_npz,
    load_safetensors,
    safetensors_io,
    save_npz,
    save_safetensors,
)
from kvsched.kernels.model import reference_logits, rotary
from kvsched.kernels.weights import Weights, expected_shapes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layers": 0}, "layers must be a positive int"),
        ({"vocab": 2.5}, "vocab must be a positive int"),
        ({"q_heads": 6, "kv_heads": 4}, "GQA group"),
        ({"q_heads": 18, "kv_heads": 2}, "GQA group"),
        ({"head_dim": 7}, "head_dim must be even"),
        ({"head_dim": 130}, "at most 128"),
        ({"cache_dtype": "bfloat16"}, "cache_dtype must be"),
        ({"rms_eps": 0.0}, "rms_eps must be a positive finite number"),
        ({"rope_theta": float("inf")}, "rope_theta must be"),
    ],
)
def test_config_refuses_impossible_shapes(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**changes)


def test_seeded_weights_are_deterministic_and_seed_dependent() -> None:
    config = ModelConfig()
    first, again, other = init_weights(config, 3), init_weights(config, 3), init_weights(config, 4)
    assert set(first.tensors) == set(expected_shapes(config))
    for name in first.tensors:
        assert first[name].tobytes() == again[name].tobytes()
    assert first["embed.weight"].tobytes() != other["embed.weight"].tobytes()


def test_weights_must_match_the_config() -> None:
    config = ModelConfig()
    tensors = dict(init_weights(config).tensors)
    with pytest.raises(ValueError, match=r"expected float32 \(61, 32\)"):
        Weights(config, {**tensors, "embed.weight": np.zeros((60, 32), np.float32)})
    with pytest.raises(ValueError, match="missing"):
        Weights(config, {k: v for k, v in tensors.items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match="unexpected"):
        Weights(config, {**tensors, "layers.9.attn.wq": tensors["layers.0.attn.wq"]})
    with pytest.raises(ValueError, match="non-finite"):
        Weights(config, {**tensors, "final_norm.weight": np.full(32, np.nan, np.float32)})


@pytest.mark.parametrize("form", ["npz", "safetensors"])
def test_weights_round_trip_through_files(tmp_path: Path, form: str) -> None:
    config = ModelConfig(layers=1)
    weights = init_weights(config, 1)
    path = tmp_path / f"model.{form}"
    (save_npz if form == "npz" else save_safetensors)(weights, path)
    loaded = (load_npz if form == "npz" else load_safetensors)(config, path)
    for name, tensor in weights.tensors.items():
        assert loaded[name].tobytes() == tensor.tobytes()
    np.testing.assert_array_equal(reference_logits(loaded, [1, 2, 3]), reference_logits(weights, [1, 2, 3]))


def test_safetensors_layout_is_the_published_format(tmp_path: Path) -> None:
    """Read back by hand: u64 header length, JSON header, packed little-endian data."""
    path = tmp_path / "t.safetensors"
    safetensors_io.save_file(
        {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([7, 8], np.int64)}, path, {"note": "x"}
    )
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert header["__metadata__"] == {"note": "x"}
    assert header["a"] == {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}
    assert header["b"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [16, 40]}
    data = raw[8 + length :]
    assert np.frombuffer(data[16:40], "<f4").tolist() == [0, 1, 2, 3, 4, 5]
    tensors, metadata = safetensors_io.load_file(path)
    assert tensors["a"].tolist() == [7, 8] and metadata == {"note": "x"}


def _handmade(path: Path, header: dict[str, Any], data: bytes) -> Path:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def test_half_and_bfloat16_weights_load_as_float32(tmp_path: Path) -> None:
    values = np.array([1.5, -2.25, 3.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    f16 = values.astype("<f2").tobytes()
    header = {
        "x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
        "y": {"dtype": "F16", "shape": [3], "data_offsets": [6, 12]},
    }
    tensors, _ = safetensors_io.load_file(_handmade(tmp_path / "h.safetensors", header, bf16 + f16))
    np.testing.assert_array_equal(tensors["x"], values)
    np.testing.assert_array_equal(tensors["y"].astype(np.float32), values)


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "do not hold shape"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "gap or overlap"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6, "bytes after the last"),
        ({"x": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unsupported dtype"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "malformed shape"),
        ({"x": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "exactly dtype, shape and data_offsets"),
    ],
)
def test_malformed_safetensors_are_refused(tmp_path: Path, header: dict[str, Any], data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        safetensors_io.load_file(_handmade(tmp_path / "bad.safetensors", header, data))


def test_truncated_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="exceeds the file"):
        safetensors_io.load_file(path)


def test_rotary_preserves_norms_and_relative_positions() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 16)).astype(np.float32)
    positions = [np.array([p], np.int64) for p in (3, 10, 0, 7)]
    rotated = [rotary(x, p, 10000.0) for x, p in zip((q, k, q, k), positions, strict=True)]
    np.testing.assert_allclose(np.linalg.norm(rotated[0]), np.linalg.norm(q), rtol=1e-5)
    # q.k depends only on the distance between positions: (3, 10) and (0, 7) are both 7 apart
    np.testing.assert_allclose(np.sum(rotated[0] * rotated[1]), np.sum(rotated[2] * rotated[3]), rtol=1e-4)


def test_reference_is_causal() -> None:
    weights = init_weights(ModelConfig(), 2)
    full = reference_logits(weights, [5, 9, 11, 2])
    prefix = reference_logits(weights, [5, 9])
    np.testing.assert_allclose(full[:2], prefix, rtol=1e-5, atol=1e-5)
