"""What the CUDA kernel modules share about the device they run on: the simulator switch and
host/device transfers.

Importing this module imports numba.cuda, which fixes for the whole process whether kernels run
natively or in the simulator (`NUMBA_ENABLE_CUDASIM=1` must be set before that import), so the
CPU paths of `kvsched.kernels` import it lazily, only when a caller first asks for device "cuda".
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from kvsched.kernels.jit import Decorator

# numba reads NUMBA_ENABLE_CUDASIM when numba itself is first imported (numba.cuda shares
# numba.core.config), so re-read the environment first: what counts is its value now.
importlib.import_module("numba.core.config").reload_config()
# Typed Any (see kvsched.kernels.jit). Kernels must call numba.cuda through this very module
# object: the simulator finds it among a kernel's globals and swaps in its per-thread fake.
cuda: Any = importlib.import_module("numba.cuda")
float32: Any = importlib.import_module("numba").float32


def jit(**options: Any) -> Decorator:
    """`numba.cuda.jit(**options)`."""
    decorator: Decorator = cuda.jit(**options)
    return decorator


# numba-cuda's simulator runs kernels as Python threads on the host: no GPU needed, slow, and
# without warp shuffles (the kernels here use none) or launch bounds.
SIMULATED = bool(cuda.config.ENABLE_CUDASIM)


def kernel_options(launch_bounds: tuple[int, ...]) -> dict[str, Any]:
    """`cuda.jit` options for a kernel always launched with `launch_bounds[0]` threads per block
    (and wanting `launch_bounds[1]` blocks resident per SM): ptxas then budgets registers for
    exactly that. The simulator takes no such option."""
    return {} if SIMULATED else {"launch_bounds": launch_bounds}


def has_native_gpu() -> bool:
    """Whether kernels run on a real GPU here (the simulator reports itself as available)."""
    return not SIMULATED and bool(cuda.is_available())


def on_device(array: Any) -> Any:
    """A device array as it is; a host array copied to the device."""
    return cuda.to_device(array) if isinstance(array, np.ndarray) else array


def is_host(array: Any) -> bool:
    """Whether `array` lives in host memory (numba-cuda's simulator has no `is_cuda_array`)."""
    return isinstance(array, np.ndarray)
