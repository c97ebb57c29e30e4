"""Greedy generation end to end, vLLM's own pool against kvsched's, on a config-only model.

Each case runs three times, each time in a fresh process: stock vLLM, vLLM with
`scheduler_cls=KvschedScheduler` (the engine core in-process, so the script can confirm the
pool it ran on), and stock vLLM with kvsched's live checker as its KV connector
(`kvsched.integrations.vllm.checker`, raising on any finding). The outputs, each request's
cached-token count and the engine's prefix-cache and preemption counters must be identical, and
the checker must have checked every step and found nothing. `--expect-different CASE` is the same comparison over
a wrong reserve (`KVSCHED_VLLM_RESERVE`), which must differ. The model is `models/kvsched/tiny-llama` (a
`config.json`, dummy weights), the prompts token ids (no tokenizer).

The "sliding window" cases run the hybrid twin (`random_model.WINDOW`: sliding-window layers of 64
tokens between full-attention ones, seeded random weights, so what a query reads changes what it
samples) through vLLM's hybrid KV cache coordinator, which every one of the three runs must use
(a connector that does not declare `SupportsHMA` turns it off); the speculative one proposes
n-gram drafts, and its greedy outputs must be those of the case without drafts. Then the first runs once
more under the checker, with a sliding-window manager that lets go of each block one token early
(vLLM's window arithmetic off by one: the block holding the window's first position is released
before the pass that reads it); the checker must name it (`window_read`). The "recurrent state" case runs a tiny
Qwen3-Next (`models/kvsched/tiny-qwen3-next`: three Gated DeltaNet layers and one full-attention
layer, dummy weights) with its states prefix-cached at block boundaries (`mamba_cache_mode`
"align"), also through the hybrid coordinator: a second wave hits the first's states. It too runs
once more under the checker, with a Mamba manager that lets go of the block a request's state is
copied from one step early (as the block it is copied into is allocated): the checker must name it
(`state_read`).

    python e2e.py [--json OUT]          (HF_HUB_OFFLINE=1; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = HERE / "models" / "kvsched" / "tiny-llama"

Wave = list[list[int]]  # prompts given to one `generate` call


def families(count: int, shared: int, own: int) -> list[Wave]:
    """One wave of `count` prompts: two families, each sharing `shared` tokens, then their own."""
    heads = [[3 + (7 * i + 11 * f) % 500 for i in range(shared)] for f in range(2)]
    return [[heads[n % 2] + [3 + (13 * n + 5 * i) % 500 for i in range(own)] for n in range(count)]]


def eviction_waves() -> list[Wave]:
    """Six prompts of distinct two-block prefixes; two long prompts that need 4 of the 12 blocks
    the six left parked (the oldest parked are evicted: the first two prefixes); the six again,
    newest first. Which of them still hit depends on the order parked blocks are evicted in."""
    first = [
        [3 + (17 * i + 29 * f) % 500 for i in range(64)] + [3 + (5 * f + 3 * i) % 500 for i in range(20)]
        for f in range(6)
    ]
    filler = [[3 + (31 * n + 7 * i) % 500 for i in range(length)] for n, length in enumerate((344, 376))]
    return [first, filler, first[::-1]]


PRESSURE = {"enable_prefix_caching": True, "num_gpu_blocks_override": 32}
SMALL_WINDOW_POOL = {"enable_prefix_caching": True, "num_gpu_blocks_override": 40}
# n-gram drafts, three a step, proposed from any earlier token that matches the last one
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
# name: (engine arguments, tokens generated per prompt, the waves of prompts)
CASES: dict[str, tuple[dict[str, Any], int, list[Wave]]] = {
    "prefix caching": ({"enable_prefix_caching": True}, 24, families(12, 160, 40)),
    "prefix caching off": ({"enable_prefix_caching": False}, 24, families(12, 160, 40)),
    "memory pressure": (PRESSURE, 48, families(16, 128, 100)),
    "eviction order": (PRESSURE, 8, eviction_waves()),
    "sliding window": ({"enable_prefix_caching": True}, 64, families(12, 160, 40)),
    "sliding window, small pool": (SMALL_WINDOW_POOL, 48, families(16, 128, 100)),
    "sliding window, speculative": (
        {"enable_prefix_caching": True, "speculative_config": NGRAM},
        64,
        families(12, 160, 40),
    ),
}
WINDOW_CASES = ("sliding window", "sliding window, small pool", "sliding window, speculative")
# Three Gated DeltaNet layers (recurrent state: vLLM's MambaManager, its states cached at block
# boundaries in "align" mode) and one full-attention layer; blocks of 288 tokens (vLLM sizes them
# so a state and a block take the same bytes), dummy weights in bfloat16 (the CPU's GDN kernel).
RECURRENT = HERE / "models" / "kvsched" / "tiny-qwen3-next"
RECURRENT_CASE = "recurrent state"
RECURRENT_ARGS = {"enable_prefix_caching": True, "mamba_cache_mode": "align", "dtype": "bfloat16"}
CASES[RECURRENT_CASE] = (
    RECURRENT_ARGS,
    48,
    [wave[:2] for wave in families(8, 320, 30)] + [wave[2:] for wave in families(8, 320, 30)],
)
HYBRID_CASES = (*WINDOW_CASES, RECURRENT_CASE)  # each run must be on vLLM's hybrid coordinator
# A case whose greedy outputs must be another's: drafts the model rejects change no token.
SAME_OUTPUTS = {"sliding window, speculative": "sliding window"}
WINDOW_MODEL = "KVSCHED_WINDOW_MODEL"  # the folder main wrote the hybrid twin's weights to


def release_window_early() -> None:
    """vLLM's sliding-window manager, broken: it skips one token more than its window leaves
    behind, so the block holding the window's first position goes before the pass reading it."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    skipped = SlidingWindowManager.get_num_skipped_tokens
    SlidingWindowManager.get_num_skipped_tokens = lambda self, computed: skipped(self, computed + 1)


def release_state_early() -> None:
    """vLLM's Mamba manager in "align" mode, broken: the block a request's running state is
    copied from (`last_state_block_idx`: a prefix hit's block, or the last step's state block) is
    let go as the block it is copied into is allocated, one step before vLLM lets it go, so the
    pass resumes its state from the null block."""
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    allocate = MambaManager.allocate_new_blocks

    def early(self: Any, request_id: str, num_tokens: int, num_tokens_main_model: int) -> Any:
        new = allocate(self, request_id, num_tokens, num_tokens_main_model)
        index = self.last_state_block_idx.get(request_id) if self.mamba_cache_mode == "align" else None
        blocks = self.req_to_blocks[request_id]
        if new and index is not None and 0 <= index < len(blocks) and not blocks[index].is_null:
            self.block_pool.free_blocks([blocks[index]])
            blocks[index] = self._null_block
        return new

    MambaManager.allocate_new_blocks = early


# Each broken run under the checker (logging): what breaks vLLM, the case it runs, the check that must name it.
BROKEN: dict[str, tuple[Callable[[], None], str, str]] = {
    "early window": (release_window_early, WINDOW_CASES[0], "window_read"),
    "early state": (release_state_early, RECURRENT_CASE, "state_read"),
}


def run_case(name: str, pool: str) -> dict[str, Any]:
    """One engine, one case: what it generated and counted (called in a fresh process)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine_args, generated, waves = CASES[name]
    extra: dict[str, Any] = {}
    model: dict[str, Any] = {"model": str(MODEL), "load_format": "dummy"}
    if name in WINDOW_CASES:
        model = {"model": os.environ[WINDOW_MODEL]}
    if name == RECURRENT_CASE:
        model = {"model": str(RECURRENT), "load_format": "dummy"}
    if pool == "kvsched":
        extra["scheduler_cls"] = "kvsched.integrations.vllm.scheduler.KvschedScheduler"
    if pool in BROKEN:
        BROKEN[pool][0]()
    if pool == "checked" or pool in BROKEN:
        from vllm.config import KVTransferConfig

        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvschedChecker",
            kv_connector_module_path="kvsched.integrations.vllm.checker",
            kv_role="kv_producer",
            kv_connector_extra_config={"kvsched_on_finding": "raise" if pool == "checked" else "log"},
        )
    llm = LLM(
        **model,
        skip_tokenizer_init=True,
        block_size=32,
        max_num_seqs=8,
        gpu_memory_utilization=0.2,
        max_num_batched_tokens=1024,
        async_scheduling=False,
        seed=0,
        disable_log_stats=False,
        **{"max_model_len": 512, "dtype": "float32", **engine_args},
        **extra,
    )
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    pool_class = type(scheduler.kv_cache_manager.block_pool).__qualname__
    params = SamplingParams(temperature=0.0, max_tokens=generated, ignore_eos=True, detokenize=False)
    started = time.perf_counter()
    outputs = [out for wave in waves for out in llm.generate([TokensPrompt(prompt_token_ids=p) for p in wave], params)]
    seconds = time.perf_counter() - started
    counters = {
        metric.name: metric.value
        for metric in llm.get_metrics()
        if metric.name
        in (
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:num_preemptions",
            "vllm:generation_tokens",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
        )
    }
    connector = scheduler.connector
    return {
        "pool": pool_class,
        "coordinator": type(scheduler.kv_cache_manager.coordinator).__name__,
        "found": None if connector is None else sorted({finding.check for finding in connector.findings}),
        "checked_steps": None if connector is None else connector.steps,
        "findings": None if connector is None else len(connector.findings),
        "outputs": [list(out.outputs[0].token_ids) for out in outputs],
        "cached_tokens": [out.num_cached_tokens for out in outputs],
        "counters": counters,
        "seconds": round(seconds, 2),
    }


def in_fresh_process(name: str, pool: str) -> dict[str, Any]:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    if name in WINDOW_CASES and WINDOW_MODEL not in env:
        env[WINDOW_MODEL] = window_model().name
    if pool == "kvsched":
        env["KVSCHED_VLLM_DEBUG"] = "1"  # every pool call checks vLLM's views against the reserve
    done = subprocess.run(
        [sys.executable, __file__, "--case", name, "--pool", pool],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} on {pool}: exit {done.returncode}\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@functools.cache
def window_model() -> tempfile.TemporaryDirectory[str]:
    """The hybrid twin with seeded random weights, written once per run to a temporary folder
    (removed when the process exits)."""
    if __package__:
        from devtools.vllm import random_model
    else:  # run as a script from outside the checkout: its folder is on sys.path
        import random_model  # type: ignore[import-not-found,no-redef]
    folder = tempfile.TemporaryDirectory(prefix="kvsched-window-")
    random_model.write(Path(folder.name), 0, random_model.WINDOW)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--pool", choices=["stock", "kvsched", "checked", *BROKEN])
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--expect-different",
        metavar="CASE",
        help="with KVSCHED_VLLM_RESERVE set to a wrong reserve: only CASE runs, and it must differ",
    )
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args.pool)))
        return 0
    failures = 0
    report: dict[str, Any] = {}
    for name in [args.expect_different] if args.expect_different else CASES:
        stock, ours = in_fresh_process(name, "stock"), in_fresh_process(name, "kvsched")
        same = {key: stock[key] == ours[key] for key in ("outputs", "cached_tokens", "counters")}
        right_pools = stock["pool"] == "BlockPool" and ours["pool"] == "KvschedBlockPool"
        ok = all(same.values()) and right_pools
        checked = None
        if not args.expect_different:
            checked = in_fresh_process(name, "checked")
            silent = checked["findings"] == 0 and checked["checked_steps"] > 0
            same_checked = all(stock[key] == checked[key] for key in ("outputs", "cached_tokens", "counters"))
            ok = ok and silent and same_checked
            same["checked"] = silent and same_checked
        like = SAME_OUTPUTS.get(name)
        if like in report:
            same[f"outputs of {like}"] = stock["outputs"] == report[like]["stock"]["outputs"]
            ok = ok and same[f"outputs of {like}"]
        if name in HYBRID_CASES:
            runs = [stock, ours] if checked is None else [stock, ours, checked]
            same["hybrid"] = all(run["coordinator"] == "HybridKVCacheCoordinator" for run in runs)
            ok = ok and same["hybrid"]
        for fault, (_, case, check) in [] if args.expect_different else BROKEN.items():
            if case != name:
                continue
            broken = in_fresh_process(name, fault)
            caught = broken["found"] == [check]
            print(
                f"{'caught' if caught else 'MISSED'}  {name}, {fault} (released a step early), under the checker:"
                f" {broken['findings']} findings {broken['found']} in {broken['checked_steps']} steps;"
                f" greedy output {'the same as' if broken['outputs'] == stock['outputs'] else 'unlike'} stock's"
            )
            report[f"{name}, {fault}"] = broken
            failures += not caught
        failures += not ok
        counters = ours["counters"]
        print(
            f"{'same' if ok else 'DIFFERENT'}  {name}: {len(ours['outputs'])} requests,"
            f" {sum(ours['cached_tokens'])} cached tokens, counters {counters};"
            f" pools {stock['pool']} / {ours['pool']}; {stock['seconds']} s / {ours['seconds']} s"
            + (
                ""
                if checked is None
                else f"; live checker: {checked['checked_steps']} steps checked,"
                f" {checked['findings']} findings, {checked['seconds']} s"
            )
            + ("" if ok else f"; differs in {[key for key, equal in same.items() if not equal]}")
        )
        report[name] = {"same": ok, "stock": stock, "kvsched": ours, "checked": checked}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.expect_different:
        return 0 if failures else 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
