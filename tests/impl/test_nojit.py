"""The kernels as plain Python (`NUMBA_DISABLE_JIT=1`, the mode CrossHair and debuggers use)
refine the spec too: the lockstep machines run against impl in that mode, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvsched.impl.lowering import lower_round
from tests.impl.lockstep import Lockstep, OwnershipAbuse

assert not hasattr(lower_round, "py_func"), "the kernels are still compiled"
for machine in (Lockstep, OwnershipAbuse):
    run_state_machine_as_test(
        machine, settings=settings(max_examples=25, deadline=None, database=None, derandomize=True)
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
