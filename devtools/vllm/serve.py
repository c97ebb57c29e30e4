"""`vllm serve` end to end: vLLM's OpenAI-compatible server stock, over kvsched's pool and under
kvsched's live checker, driven by the `openai` client; the outputs must be identical.

Each mode starts vLLM's server (0.32.0's CPU build, `models/kvsched/tiny-llama`: a `config.json`
and dummy weights, token-id prompts, loopback only) in its own process, waits for `/health`,
sends every completion of a wave at once from a thread pool (two families of shared prefixes,
32 blocks of 32 tokens: prefix hits and preemptions), reads `/metrics`, then stops the server
with SIGTERM and requires it to exit 0 within a minute:

    stock          vLLM as it ships
    kvsched        --scheduler-cls kvsched.integrations.vllm.scheduler.KvschedScheduler
    kvsched-async  --scheduler-cls ...KvschedAsyncScheduler --async-scheduling
    checked        --kv-transfer-config '{"kv_connector": "KvschedChecker", ...}' (a finding raises
                   in the engine, which fails every request still open)

Greedy (temperature 0) completions' token ids must be the same in every mode, every request
must succeed, the stock server must have preempted and hit the prefix cache, and kvsched's pool
must have served the kvsched modes (the scheduler logs "... over KvschedBlockPool" when built).

    python serve.py [--json OUT] [--port 8765]    (vLLM's venv; run from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = HERE / "models" / "kvsched" / "tiny-llama"
SCHEDULERS = "kvsched.integrations.vllm.scheduler"
CHECKER = {
    "kv_connector": "KvschedChecker",
    "kv_connector_module_path": "kvsched.integrations.vllm.checker",
    "kv_role": "kv_producer",
    "kv_connector_extra_config": {"kvsched_on_finding": "raise"},
}
MODES: dict[str, list[str]] = {
    "stock": [],
    "kvsched": ["--scheduler-cls", f"{SCHEDULERS}.KvschedScheduler", "--no-async-scheduling"],
    "kvsched-async": ["--scheduler-cls", f"{SCHEDULERS}.KvschedAsyncScheduler", "--async-scheduling"],
    "checked": ["--kv-transfer-config", json.dumps(CHECKER)],
}
SERVER = [
    "--model", str(MODEL), "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "float32",
    "--block-size", "32", "--max-model-len", "512", "--max-num-seqs", "8", "--max-num-batched-tokens", "1024",
    "--num-gpu-blocks-override", "32", "--enable-prefix-caching", "--seed", "0", "--gpu-memory-utilization", "0.2",
]  # fmt: skip


def waves() -> list[list[list[int]]]:
    """Two waves of 16 prompts: two families sharing 128 tokens each, then 100 of their own."""
    heads = [[3 + (7 * i + 11 * f) % 500 for i in range(128)] for f in range(2)]
    return [
        [heads[n % 2] + [3 + (13 * n + 5 * i + 17 * wave) % 500 for i in range(100)] for n in range(16)]
        for wave in range(2)
    ]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples in `/metrics`' text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def serve(mode: str, port: int, log: Path) -> dict[str, Any]:
    """One server in `mode`: the completions' token ids, its counters, how it stopped."""
    from openai import OpenAI

    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu")
    with open(log, "w", encoding="utf-8") as out:
        server = subprocess.Popen([*command, *SERVER, *MODES[mode]], stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"{mode}: the server exited ({server.returncode}) before it was up; see {log}")
            try:
                _get(f"{base}/health")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{mode}: the server was not up within 300 s; see {log}") from None
                time.sleep(1)
        client = OpenAI(base_url=f"{base}/v1", api_key="loopback", max_retries=0, timeout=600)

        def complete(prompt: list[int]) -> list[int]:
            answer = client.completions.create(
                model=str(MODEL),
                prompt=prompt,
                max_tokens=48,
                temperature=0.0,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            return list(answer.choices[0].token_ids)

        outputs: list[list[int]] = []
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            for wave in waves():
                outputs += list(pool.map(complete, wave))
        seconds = time.perf_counter() - started
        metrics = _get(f"{base}/metrics")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise SystemExit(f"{mode}: the server did not stop within 60 s of SIGTERM; see {log}") from None
    text = log.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        raise SystemExit(f"{mode}: the server exited {code} after SIGTERM; see {log}")
    return {
        "mode": mode,
        "outputs": outputs,
        "preemptions": metric(metrics, "vllm:num_preemptions_total"),
        "prefix_hits": metric(metrics, "vllm:prefix_cache_hits_total"),
        "kvsched_scheduler_loaded": "over KvschedBlockPool" in text,
        "checker_findings_logged": text.count("kvsched live checker"),
        "seconds": round(seconds, 2),
        "exit": code,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder (default: removed at the end)")
    args = parser.parse_args(argv)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        return _compare(args, args.logs)
    with tempfile.TemporaryDirectory(prefix="kvsched-serve-") as logs:
        return _compare(args, Path(logs))


def _compare(args: argparse.Namespace, logs: Path) -> int:
    """Every server of `MODES` on the same prompts, logs in `logs`: the same completions."""
    keep = "" if args.logs is not None else " (rerun with --logs DIR to keep the servers' logs)"
    runs = []
    for mode in MODES:
        run = serve(mode, args.port, logs / f"{mode}.log")
        summary = {key: value for key, value in run.items() if key != "outputs"}
        print(f"{mode}: {summary}", file=sys.stderr, flush=True)
        runs.append(run)
    stock = runs[0]
    if not stock["preemptions"] or not stock["prefix_hits"]:
        raise SystemExit(f"the stock server must preempt and hit the prefix cache: {stock}{keep}")
    for run in runs[1:]:
        if run["outputs"] != stock["outputs"]:
            differing = [n for n, (a, b) in enumerate(zip(stock["outputs"], run["outputs"], strict=True)) if a != b]
            raise SystemExit(f"{run['mode']}: completions {differing} differ from stock vLLM's{keep}")
        if run["mode"].startswith("kvsched") and not run["kvsched_scheduler_loaded"]:
            raise SystemExit(f"{run['mode']}: the server's log does not name kvsched's scheduler{keep}")
    if runs[-1]["checker_findings_logged"]:
        raise SystemExit(f"the live checker reported findings on stock vLLM{keep}")
    where = f"; logs in {logs}" if args.logs is not None else ""
    print(f"identical over {len(runs)} servers, {len(stock['outputs'])} completions each{where}", file=sys.stderr)
    if args.json:
        args.json.write_text(
            json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in runs], indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
