"""Compile every kernel signature to sm_90 PTX and ask ptxas what each costs: registers, spills,
stack, shared memory. No GPU is needed; a spill fails the kernels' test suite.

numba-cuda compiles PTX only when it is not simulating, and a process picks simulation once, at
its first `import numba.cuda`; `report()` therefore compiles in a fresh interpreter whenever this
one is (or may become) a simulator. numba-cuda 0.30 also asks the current device for its compute
capability when it compiles a `@cuda.jit(device=True)` helper, which fails without a GPU; the
compiling process answers that question with the target's capability instead (`_target_device`).

Run `python -m kvsched.kernels.ptx [--json PATH]` for the table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import kvsched

TARGET_CC = (9, 0)  # Hopper (H100/H200): the GPUs the decode path is sized for
ARCH = "sm_90"


@dataclass(frozen=True, slots=True)
class KernelReport:
    """What ptxas reports for one kernel compiled for one cache dtype."""

    kernel: str
    cache_dtype: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack_frame: int  # bytes
    shared_bytes: int  # static shared memory declared by the kernel
    max_threads: int  # threads per block the kernel is launched with (its launch bound)


def find_ptxas() -> Path:
    """The ptxas to use: $KVSCHED_PTXAS, the CUDA 13.0 wheels' (`nvidia/cu13/bin`), $CUDA_HOME's,
    then the PATH's. Raises `FileNotFoundError` naming the places searched."""
    candidates: list[Path] = []
    if os.environ.get("KVSCHED_PTXAS"):
        candidates.append(Path(os.environ["KVSCHED_PTXAS"]))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += [Path(root) / "cu13" / "bin" / "ptxas", Path(root) / "cuda_nvcc" / "bin" / "ptxas"]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]) / "bin" / "ptxas")
    on_path = shutil.which("ptxas")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    searched = ", ".join(str(c) for c in candidates) or "nothing"
    raise FileNotFoundError(f"no ptxas found (searched {searched}); install the 'cuda' extra or set KVSCHED_PTXAS")


def parse_ptxas(output: str) -> tuple[int, int, int, int]:
    """(registers, spill store bytes, spill load bytes, stack frame bytes) from `ptxas -v` output."""
    registers = re.search(r"Used (\d+) registers", output)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", output)
    if registers is None or frame is None:
        raise ValueError(f"unrecognised ptxas output:\n{output}")
    return int(registers[1]), int(frame[2]), int(frame[3]), int(frame[1])


def shared_bytes(ptx: str) -> int:
    """Static shared memory the PTX declares (ptxas -c does not attribute module-scope arrays)."""
    return sum(int(size) for size in re.findall(r"\.shared\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]", ptx))


def compile_reports(ptxas: Path | None = None) -> list[KernelReport]:
    """Compile and assemble every kernel here; the process must not be a CUDA simulator."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise RuntimeError("compile_reports needs a process without NUMBA_ENABLE_CUDASIM; use report()")
    from kvsched.kernels import cuda_attention, cuda_cache
    from kvsched.kernels.device import cuda
    from kvsched.kernels.jit import types

    assembler = ptxas or find_ptxas()

    def array(dtype: Any, ndim: int) -> Any:
        return types.Array(dtype, ndim, "C")

    f32, i32, u32 = types.float32, types.int32, types.uint32
    reports = []
    with _target_device():
        for name, cache in (("float16", types.float16), ("float32", types.float32)):
            jobs = [
                (
                    cuda_attention.paged_attention_kernel,
                    (array(f32, 3), array(cache, 4), array(cache, 4), array(u32, 1), array(i32, 1))
                    + (array(i32, 1), array(i32, 1), f32, array(f32, 3)),
                    cuda_attention.LAUNCH_BOUNDS,
                ),
                (
                    cuda_cache.append_kv_kernel,
                    (array(f32, 3), array(f32, 3), array(cache, 4), array(cache, 4), array(u32, 1))
                    + (array(i32, 1), array(i32, 1)),
                    (cuda_cache.THREADS,),
                ),
                (
                    cuda_cache.copy_pages_kernel,
                    (array(cache, 3), array(cache, 3), array(i32, 2)),
                    (cuda_cache.THREADS,),
                ),
                (
                    cuda_cache.copy_tier_kernel,
                    (array(cache, 3), array(cache, 3), array(cache, 3), array(cache, 3), array(i32, 2)),
                    (cuda_cache.THREADS,),
                ),
            ]
            for kernel, signature, bounds in jobs:
                ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=TARGET_CC, launch_bounds=bounds)
                registers, stores, loads, frame = _assemble(assembler, ptx)
                reports.append(
                    KernelReport(
                        kernel.py_func.__name__, name, registers, stores, loads, frame, shared_bytes(ptx), bounds[0]
                    )
                )
    return reports


def report(ptxas: Path | None = None, timeout: float = 300.0) -> list[KernelReport]:
    """`compile_reports()` in a fresh interpreter without the simulator, for the CLI and tests."""
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    # The child must import this same kvsched, installed or not (e.g. run from a checkout).
    root = str(Path(kvsched.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "kvsched.kernels.ptx", "--json", "-"]
    if ptxas is not None:
        command += ["--ptxas", str(ptxas)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"PTX compile failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return [KernelReport(**entry) for entry in json.loads(done.stdout)]


def format_table(reports: list[KernelReport]) -> str:
    """A fixed-width table of the reports."""
    header = f"{'kernel':<24} {'cache':<8} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'stack':>6} {'smem':>7}"
    lines = [header, "-" * len(header)]
    for r in reports:
        lines.append(
            f"{r.kernel:<24} {r.cache_dtype:<8} {r.registers:>5} {r.spill_stores:>9} {r.spill_loads:>9} "
            f"{r.stack_frame:>6} {r.shared_bytes:>7}"
        )
    return "\n".join(lines)


def _assemble(ptxas: Path, ptx: str) -> tuple[int, int, int, int]:
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [str(ptxas), f"-arch={ARCH}", "-c", "-v", str(source), "-o", str(Path(folder) / "kernel.o")],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed ({done.returncode}):\n{done.stderr}")
    return parse_ptxas(done.stdout + done.stderr)


@contextlib.contextmanager
def _target_device() -> Iterator[None]:
    """Without a GPU, let numba-cuda compile device helpers for TARGET_CC (see the module docstring)."""
    from kvsched.kernels.device import cuda

    dispatcher: Any = importlib.import_module("numba.cuda.dispatcher")
    if cuda.is_available():
        yield
        return

    class _Target:
        compute_capability = TARGET_CC

    original = dispatcher.get_current_device
    dispatcher.get_current_device = _Target
    try:
        yield
    finally:
        dispatcher.get_current_device = original


def main(argv: list[str] | None = None) -> int:
    """Print the register/spill table; `--json PATH` (or `-` for stdout alone) writes the reports."""
    parser = argparse.ArgumentParser(prog="python -m kvsched.kernels.ptx", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the reports as JSON to this path ('-': stdout only)")
    parser.add_argument("--ptxas", type=Path, help="the ptxas binary (default: searched, see find_ptxas)")
    args = parser.parse_args(argv)
    simulating = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    reports = report(args.ptxas) if simulating else compile_reports(args.ptxas)
    payload = json.dumps([asdict(r) for r in reports], indent=2)
    if args.json == "-":
        print(payload)
        return 0
    print(format_table(reports))
    if args.json:
        Path(args.json).write_text(payload + "\n")
    return 1 if any(r.spill_stores or r.spill_loads for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
