"""The decoder-only transformer's dense arithmetic, and a reference forward over a dense cache.

One layer, for a batch of tokens at known positions:

    h = rms_norm(x) * attn_norm;  q, k, v = h Wq, h Wk, h Wv  (split into heads; rotary on q, k)
    x = x + attention(q, K, V) Wo         K, V: every earlier position's k, v (and this one's)
    h = rms_norm(x) * mlp_norm;   x = x + (silu(h Wg) * (h Wu)) Wd
    logits = (rms_norm(x) * final_norm) W_lm;  next token = argmax(logits)

`Transformer` holds the per-token parts (everything but the attention) so that the paged backends
and `reference_logits` share them bit for bit; they differ only in where K and V live. The
reference keeps a dense per-sequence cache and attends with the numpy oracle's formula in
float64, rounding K and V to the cache dtype exactly as storing them in the paged cache does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvsched.kernels.config import ModelConfig
from kvsched.kernels.weights import Weights

F32 = npt.NDArray[np.float32]
Positions = npt.NDArray[np.int64]


def rms_norm(x: F32, gain: F32, eps: float) -> F32:  # x [n, hidden], gain [hidden]
    """x / sqrt(mean(x^2) + eps) * gain, row by row."""
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    normed: F32 = (x * scale * gain).astype(np.float32)
    return normed


def rotary(x: F32, positions: Positions, theta: float) -> F32:  # x [n, heads, head_dim]
    """Rotate dimension pairs (i, i + head_dim/2) of every head by position * theta^(-2i/head_dim)
    (the "rotate half" convention of GPT-NeoX and Hugging Face Llama)."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / x.shape[-1])
    angles = positions.astype(np.float64)[:, None] * frequencies[None, :]  # [n, half]
    cos = np.cos(angles)[:, None, :].astype(np.float32)
    sin = np.sin(angles)[:, None, :].astype(np.float32)
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(np.float32)


def silu(x: F32) -> F32:
    """x * sigmoid(x)."""
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


class Transformer:
    """The per-token arithmetic of the model; attention is supplied by the caller."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.config: ModelConfig = weights.config

    def embed(self, tokens: npt.NDArray[np.integer]) -> F32:  # tokens [n] -> [n, hidden]
        """The embedding rows of `tokens`; `ValueError` on an id outside the vocabulary."""
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab):
            bad = int(tokens[(tokens < 0) | (tokens >= self.config.vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab})")
        return self.weights["embed.weight"][tokens.astype(np.int64)]

    def project(self, layer: int, x: F32, positions: Positions) -> tuple[F32, F32, F32]:
        """q `[n, q_heads, head_dim]`, k and v `[n, kv_heads, head_dim]` float32, rotary applied."""
        c = self.config
        h = rms_norm(x, self.weights.layer(layer, "attn_norm.weight"), c.rms_eps)
        q = (h @ self.weights.layer(layer, "attn.wq")).reshape(-1, c.q_heads, c.head_dim)
        k = (h @ self.weights.layer(layer, "attn.wk")).reshape(-1, c.kv_heads, c.head_dim)
        v = (h @ self.weights.layer(layer, "attn.wv")).reshape(-1, c.kv_heads, c.head_dim)
        return (
            np.ascontiguousarray(rotary(q, positions, c.rope_theta)),
            np.ascontiguousarray(rotary(k, positions, c.rope_theta)),
            np.ascontiguousarray(v, dtype=np.float32),
        )

    def finish_layer(self, layer: int, x: F32, attended: F32) -> F32:  # attended [n, q_heads, head_dim]
        """The residual stream after the attention output projection and the MLP."""
        c = self.config
        x = x + attended.reshape(x.shape[0], -1) @ self.weights.layer(layer, "attn.wo")
        h = rms_norm(x, self.weights.layer(layer, "mlp_norm.weight"), c.rms_eps)
        gate = silu(h @ self.weights.layer(layer, "mlp.w_gate"))
        mixed = (gate * (h @ self.weights.layer(layer, "mlp.w_up"))) @ self.weights.layer(layer, "mlp.w_down")
        return (x + mixed).astype(np.float32)

    def logits(self, x: F32) -> F32:  # x [n, hidden] -> [n, vocab]
        """Next-token logits."""
        h = rms_norm(x, self.weights["final_norm.weight"], self.config.rms_eps)
        return (h @ self.weights["lm_head.weight"]).astype(np.float32)


def reference_logits(weights: Weights, tokens: Sequence[int]) -> F32:  # -> [len(tokens), vocab]
    """Causal forward of one whole sequence over a dense cache: the logits after every position (a
    sliding-window layer's query reading only its window)."""
    model = Transformer(weights)
    c = model.config
    ids = np.asarray(tokens, dtype=np.int64)
    positions = np.arange(ids.shape[0], dtype=np.int64)
    x = model.embed(ids)
    causal = positions[None, :] <= positions[:, None]  # [query, key]
    for layer in range(c.layers):
        q, k, v = model.project(layer, x, positions)
        keys = np.repeat(k.astype(c.cache_numpy_dtype).astype(np.float64), c.group, axis=1)  # [n, q_heads, d]
        values = np.repeat(v.astype(c.cache_numpy_dtype).astype(np.float64), c.group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), keys) * c.scale
        window = c.window(layer)
        seen = causal & (positions[None, :] > positions[:, None] - window) if window else causal
        scores = np.where(seen[None], scores, -np.inf)
        weights_ = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights_ /= weights_.sum(axis=-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", weights_, values).astype(np.float32)
        x = model.finish_layer(layer, x, attended)
    return model.logits(x)


def greedy_reference(weights: Weights, prompt: Sequence[int], steps: int) -> tuple[list[int], F32]:
    """`steps` greedy tokens after `prompt` by the dense reference, and the logits that chose
    each (`[steps, vocab]`)."""
    tokens = list(prompt)
    chosen: list[F32] = []
    for _ in range(steps):
        logits = reference_logits(weights, tokens)[-1]
        chosen.append(logits)
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :], np.stack(chosen) if chosen else np.zeros((0, weights.config.vocab), np.float32)
