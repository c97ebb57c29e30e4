"""The kernels as plain Python (`NUMBA_DISABLE_JIT=1`, the mode CrossHair and debuggers use)
refine the spec too: the lockstep machine runs against impl in that mode, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
from hypothesis import settings
from kvsched.impl.lowering import lower_round
from kvsched.testing.campaign import run_machine
from kvsched.testing.impl_system import impl_system
from kvsched.testing.machine import KvschedMachine, OwnershipAbuse
from kvsched.testing.system import spec_system

assert not hasattr(lower_round, "py_func"), "the kernels are still compiled"
for machine in (KvschedMachine, OwnershipAbuse):
    run_machine(
        lambda: machine(impl_system, spec_system),
        settings(max_examples=25, deadline=None, database=None, derandomize=True),
    )
print("refined")
"""


def test_uncompiled_kernels_refine_the_spec() -> None:
    environment = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "refined"
