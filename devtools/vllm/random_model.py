"""A tiny Llama with seeded random weights, whose next token depends on the context.

vLLM's `--load-format dummy` fills every weight uniformly within ±1e-3: the logits are flat (every
logprob about -ln 512) and the greedy token follows from the previous token alone, so identical
token ids cannot tell right KV from wrong. These weights are drawn from seeded normals scaled so
that attention is peaked and the logits spread: what a request reads from its KV changes what it
samples. `write(folder)` writes `config.json` (the shape of `models/kvsched/tiny-llama`) and
`model.safetensors` there; the same seed gives the same bytes. `WINDOW` is its hybrid twin
(`models/kvsched/tiny-llama-window`): four layers, sliding-window attention of 64 tokens in the
first and third and full attention in the others, as Gemma 3 and gpt-oss interleave them, which
vLLM serves through its hybrid KV cache coordinator.

    python random_model.py FOLDER [--seed 0] [--window]      (vLLM's venv: torch and safetensors)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "models" / "kvsched" / "tiny-llama" / "config.json"
WINDOW = CONFIG.parent.parent / "tiny-llama-window" / "config.json"
SCALE = {"embed": 1.0, "attention": 3.0, "mlp": 1.0, "head": 4.0}  # times 1/sqrt(fan-in), the embedding's 1


def weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Every weight vLLM's Llama loads, by its checkpoint name, drawn from `seed`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads, head = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def normal(rows: int, columns: int, scale: float) -> Any:
        return torch.randn(rows, columns, generator=generator) * (scale / columns**0.5)

    found = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=generator) * SCALE["embed"],
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": normal(vocab, hidden, SCALE["head"]),
    }
    for layer in range(config["num_hidden_layers"]):
        at = f"model.layers.{layer}"
        found |= {
            f"{at}.input_layernorm.weight": torch.ones(hidden),
            f"{at}.post_attention_layernorm.weight": torch.ones(hidden),
            f"{at}.self_attn.q_proj.weight": normal(heads * head, hidden, SCALE["attention"]),
            f"{at}.self_attn.k_proj.weight": normal(kv_heads * head, hidden, SCALE["attention"]),
            f"{at}.self_attn.v_proj.weight": normal(kv_heads * head, hidden, 1.0),
            f"{at}.self_attn.o_proj.weight": normal(hidden, heads * head, 1.0),
            f"{at}.mlp.gate_proj.weight": normal(inner, hidden, SCALE["mlp"]),
            f"{at}.mlp.up_proj.weight": normal(inner, hidden, SCALE["mlp"]),
            f"{at}.mlp.down_proj.weight": normal(hidden, inner, SCALE["mlp"]),
        }
    return {name: tensor.contiguous() for name, tensor in found.items()}


def write(folder: Path, seed: int = 0, config_file: Path = CONFIG) -> Path:
    """The model's `config.json` and `model.safetensors` in `folder` (made if missing)."""
    from safetensors.torch import save_file

    config = json.loads(config_file.read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(weights(config, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", action="store_true", help="the hybrid twin (sliding-window and full layers)")
    args = parser.parse_args(argv)
    print(write(args.folder, args.seed, WINDOW if args.window else CONFIG))
    return 0


if __name__ == "__main__":
    sys.exit(main())
