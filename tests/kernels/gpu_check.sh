#!/usr/bin/env bash
# The kernels' GPU checks in one run, for a machine with a CUDA GPU (nothing here needs network):
# the ptxas register/spill report, the decode bench with its HBM figure, and the whole kernels suite
# with device "cuda" native (it runs in the simulator elsewhere) and the GPU-only tests.
# Usage: tests/kernels/gpu_check.sh [OUTPUT_DIR]   (reports land in OUTPUT_DIR, default ./gpu-check)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-gpu-check}"
mkdir -p "$out"
python="${PYTHON:-python}"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
"$python" -c 'from numba import cuda; assert cuda.is_available(), "no CUDA GPU visible"; print(cuda.get_current_device().name)'
status=0
"$python" -m kvsched.kernels.ptx --json "$out/ptx.json" 2>&1 | tee "$out/ptx.txt" || status=$?
"$python" -m kvsched.kernels.bench --gpu --json "$out/bench.json" \
    2>&1 | tee "$out/bench.txt" || status=$?
"$python" -m pytest -q -rs -s tests/kernels 2>&1 | tee "$out/pytest.log" || status=$?
exit "$status"
