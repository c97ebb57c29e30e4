"""The thrash trace through vLLM's own `Scheduler` and through kvsched's engine, in one process.

`kvsched bench thrash`'s trace (200 requests, prompts of 1 to 3,000 tokens, 1 to 64 new tokens,
3 priorities, seeded) on pools of 256, 512 and 1,024 pages of 16: vLLM 0.32.0's v1 `Scheduler`
(`schedule()` then `update_from_output()` with a model runner that samples one token for every
request whose prompt is computed; chunked prefill, prefix caching off, the priority policy, at
most 32 requests and 2,048 tokens a step, as kvsched's defaults) beside kvsched's impl engine
under each admission policy. For each: tokens computed ÷ tokens needed, preemptions, steps and
tokens needed per step. vLLM's pool gets one block more than kvsched's: its block 0 is the null
block, never handed out.

    python thrash.py [--json OUT]      (vLLM's venv; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
from typing import Any

from kvsched.impl.thrash_bench import HEADER, POOLS, cells, run, trace
from kvsched.report import measurement, print_table
from kvsched.spec.engine_config import ADMISSIONS, EngineRequest

BLOCK = 16
MAX_SEQS = 32
MAX_TOKENS = 2048
MODEL_LEN = 4096
# facebook/opt-125m's shape, as a local config.json (no weights, no tokenizer, no network).
FAKE_MODEL = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "eos_token_id": 2,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "max_position_embeddings": MODEL_LEN,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}


def scheduler(
    blocks: int,
    prefix_caching: bool = False,
    kv_transfer: dict[str, Any] | None = None,
    max_seqs: int = MAX_SEQS,
    max_tokens: int = MAX_TOKENS,
    scheduler_class: Any = None,
    kv_events: bool = False,
) -> Any:
    """vLLM's v1 `Scheduler` (or `scheduler_class`) over a pool of `blocks` blocks (as its tests'
    `create_scheduler`), with a KV connector when `kv_transfer` configures one (and then the KV
    cache's one backing tensor described, which an offloading connector sizes its tier from);
    with `kv_events`, the pool publishes KV events (to vLLM's null publisher)."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.config.kv_events import KVEventsConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(
        model=model_folder(), dtype="float16", seed=0, skip_tokenizer_init=True, max_model_len=MODEL_LEN
    )
    schedule = SchedulerConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max_tokens,
        max_model_len=MODEL_LEN,
        enable_chunked_prefill=True,
        async_scheduling=False,
        is_encoder_decoder=False,
        policy="priority",
    )
    cache = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=prefix_caching)
    config = VllmConfig(
        scheduler_config=schedule,
        model_config=model,
        cache_config=cache,
        parallel_config=ParallelConfig(),
        kv_transfer_config=None if kv_transfer is None else KVTransferConfig(**kv_transfer),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None,
    )
    cache.num_gpu_blocks = blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    page = spec.page_size_bytes
    tensors = [] if kv_transfer is None else [KVCacheTensor(blocks * page, ["layer"], blocks * page, page)]
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return (scheduler_class or Scheduler)(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=False,
    )


_FOLDER: list[str] = []  # the fake model's folder, once made


def model_folder() -> str:
    """A folder holding the fake model's config.json: one per process, removed when it exits
    (every scheduler reads the same config, so nothing is left behind however many are built)."""
    if not _FOLDER:
        folder = tempfile.mkdtemp(prefix="kvsched-thrash-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as file:
            json.dump(FAKE_MODEL, file)
        _FOLDER.append(folder)
    return _FOLDER[0]


def step(sched: Any) -> tuple[Any, Any]:
    """One `schedule()` and `update_from_output()`, with a model runner that samples token 7 for
    every request whose prompt is computed: the scheduler's output and results."""
    from vllm.v1.outputs import ModelRunnerOutput

    output = sched.schedule()
    ids = list(output.num_scheduled_tokens)
    states = sched.requests
    sampled = [[7] if states[rid].num_computed_tokens >= states[rid].num_tokens else [] for rid in ids]
    fields: dict[str, Any] = {"req_ids": ids, "sampled_token_ids": sampled}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # 0.32 and 0.33 (0.34 reads req_ids alone)
        fields["req_id_to_index"] = {rid: index for index, rid in enumerate(ids)}
    runner = ModelRunnerOutput(**fields)
    return output, sched.update_from_output(output, runner)


def vllm_run(pages: int, requests: list[EngineRequest]) -> dict[str, Any]:
    """The trace through vLLM's scheduler with `pages` usable blocks, to the end."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sched = scheduler(pages + 1)
    for request in requests:
        params = SamplingParams(max_tokens=request.max_new_tokens, ignore_eos=True)
        sched.add_request(
            Request(
                request_id=str(request.request_id),
                prompt_token_ids=list(request.prompt),
                sampling_params=params,
                pooling_params=None,
                priority=-request.priority,  # vLLM runs the lowest value first; kvsched the highest
            )
        )
    computed = preemptions = steps = 0
    finished = 0
    while sched.has_requests():
        output, results = step(sched)
        computed += output.total_num_scheduled_tokens
        preemptions += len(output.preempted_req_ids or ())
        finished += sum(item.finish_reason is not None for result in results.values() for item in result.outputs)
        steps += 1
        if steps > 100_000:
            raise AssertionError("vLLM's scheduler did not finish the trace in 100,000 steps")
    if finished != len(requests):
        raise AssertionError(f"vLLM's scheduler finished {finished} of {len(requests)} requests")
    needed = sum(len(request.prompt) + request.max_new_tokens - 1 for request in requests)
    return {
        "engine": "vLLM 0.32.0 Scheduler",
        "pages": pages,
        "admission": "vLLM",
        "computed_over_needed": round(computed / needed, 3),
        "computed": computed,
        "needed": needed,
        "preemptions": preemptions,
        "steps": steps,
        "needed_per_step": round(needed / steps, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thrash.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the report to PATH")
    args = parser.parse_args(argv)
    measured = measurement("python devtools/vllm/thrash.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    requests = trace()
    rows = []
    for pages in POOLS:
        print(f"[thrash] {pages} pages: vLLM ...", file=sys.stderr, flush=True)
        rows.append(vllm_run(pages, requests))
        for admission in ADMISSIONS:
            print(f"[thrash] {pages} pages: kvsched {admission} ...", file=sys.stderr, flush=True)
            rows.append({"engine": "kvsched.impl Engine", **run(pages, admission, requests).row()})
    print_table([[row["engine"], *cells(row)] for row in rows], ["engine", *HEADER])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"measured": measured, "page_size": BLOCK, "rows": rows}, file, indent=1)
            file.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
