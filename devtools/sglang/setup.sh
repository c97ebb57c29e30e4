#!/usr/bin/env bash
# The venv `make sglang` runs in: SGLang 0.5.23 --no-deps over its own torch pin (2.14.1 with
# torchvision 0.29.1: a CUDA build, about 5.5 GB, on this machine's disk for Python 3.11; it runs
# on the CPU), and only what importing SGLang's cache modules (radix_cache, the token allocators,
# schedule_batch's ReqKvInfo, memory_pool's ReqToTokenPool) needs on the CPU, found by importing
# them in a bare venv and adding each module they asked for; then what kvsched's harness needs.
# Versions: devtools/sglang/constraints.txt. Usage: devtools/sglang/setup.sh VENV
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$(realpath -m "${1:?usage: setup.sh VENV}")"
PY="${PYTHON:-python3}"
pipv() { "$venv/bin/pip" install -q --no-cache-dir -c "$here/constraints.txt" "$@"; }

test -d "$venv" || "$PY" -m venv "$venv"
pipv torch==2.14.1 torchvision==0.29.1
pipv --no-deps sglang==0.5.23
# What `import sglang.srt.mem_cache.radix_cache` (and the allocators) needs on the CPU.
pipv orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm ipython \
    aiohttp transformers tokenizers dill apache-tvm-ffi sentencepiece compressed-tensors gguf openai \
    partial-json-parser triton
# kvsched's harness (run from this checkout: PYTHONPATH).
pipv numba llvmlite xxhash hypothesis rich
cd /
"$venv/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore")
import sglang, torch
import sglang.srt.mem_cache.radix_cache, sglang.srt.mem_cache.allocator.paged, sglang.srt.mem_cache.allocator.token
print("sglang", sglang.__version__, "torch", torch.__version__, "cache modules import")
PY
