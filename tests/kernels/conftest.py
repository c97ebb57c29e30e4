"""Kernel-test setup: CUDA kernels run in numba-cuda's simulator unless told otherwise.

numba.cuda decides between GPU and simulator once, when it is first imported, from
NUMBA_ENABLE_CUDASIM (`kvsched.kernels.device` re-reads the environment just before that import).
Nothing in kvsched imports numba.cuda before a "cuda" device is used, so setting the default here
(before any test runs) puts this suite's CUDA tests on the simulator on a machine without a GPU.
`gpu_check.sh` sets NUMBA_ENABLE_CUDASIM=0 to run the same tests natively on a GPU.
"""

from __future__ import annotations

import os
import sys

import pytest

if "numba.cuda" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a native CUDA GPU (skipped elsewhere); see gpu_check.sh")


@pytest.fixture(scope="session")
def cuda_mode() -> str:
    """ "simulator" or "gpu": where device "cuda" runs here; skips the test when it cannot run."""
    from kvsched.kernels.device import SIMULATED, has_native_gpu

    if SIMULATED:
        return "simulator"
    if has_native_gpu():
        return "gpu"
    pytest.skip("device 'cuda' unavailable: no GPU, and numba.cuda was imported without NUMBA_ENABLE_CUDASIM=1")


@pytest.fixture(scope="session")
def native_gpu() -> None:
    """Skips the test unless a real GPU runs the kernels."""
    from kvsched.kernels.device import SIMULATED, has_native_gpu

    if SIMULATED:
        pytest.skip("needs a native GPU: CUDA runs in the simulator here; on a GPU run tests/kernels/gpu_check.sh")
    if not has_native_gpu():
        pytest.skip("needs a native GPU: numba.cuda.is_available() is False on this machine")
