"""Decode-attention throughput: the numba twin against the numpy oracle and torch, as GB/s of K+V
read, against this machine's measured memory-copy bandwidth; on a GPU, against HBM peak.

    python -m kvsched.kernels.bench [--json PATH] [--quick] [--gpu] [--no-torch]

Bytes are counted as the kernel must move them: every K and V element of every context position
once (`sum(context_lens) * kv_heads * head_dim * 2 * itemsize`). The copy reference is numpy
copying a large array, counted as bytes read + bytes written per second (a copy moves both), so
"fraction of copy" compares like with like: bytes through the memory system per second.
The torch path gathers each request's pages into contiguous K/V (`index_select`) and calls
`scaled_dot_product_attention` per request with each kv head's query heads as its query rows
(the cheapest exact GQA decode in torch: `enable_gqa=True` repeats K and V and ran ~2x slower),
in float32 (float16 caches are widened after the gather; torch's CPU half matmul is no baseline).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.charts import BarChart, Reference
from kvsched.kernels import ops
from kvsched.report import CommandParser, measurement, write_json

H200_HBM_PEAK_GBPS = 4800.0  # NVIDIA's figure for the H200's HBM3e (4.8 TB/s)
TWIN_SPEEDUP_TARGET = 1.5  # numba twin vs torch path
COPY_FRACTION_TARGET = 0.40  # numba twin vs measured copy bandwidth


@dataclass(frozen=True, slots=True)
class DecodeShape:
    """One decode round's shape."""

    requests: int = 32
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    min_context: int = 512
    max_context: int = 2048
    page_size: int = 16


@dataclass
class Row:
    """One implementation's measurement on one cache dtype."""

    cache_dtype: str
    implementation: str
    seconds: float
    gbps: float
    fraction_of_copy: float
    max_abs_error: float
    speedup_vs_torch: float | None = None
    notes: str = ""


@dataclass
class Report:
    """Everything the bench measured (serialised as the JSON output)."""

    measured: dict[str, object]  # kvsched.report.measurement: date, command, machine, load
    shape: dict[str, int]
    cpu_count: int
    copy_gbps: float
    load_average: list[float]  # 1/5/15-minute load when the bench started: other work skews it
    rows: list[Row] = field(default_factory=list)
    targets: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)


def decode_batch(rng: np.random.Generator, shape: DecodeShape, dtype: Any) -> dict[str, Any]:
    """A decode round over shuffled pages: one query per request, contexts uniform in range."""
    lens = rng.integers(shape.min_context, shape.max_context + 1, size=shape.requests).astype(np.int32)
    needed = (lens + shape.page_size - 1) // shape.page_size
    pages = int(needed.sum())
    cache_shape = (pages, shape.page_size, shape.kv_heads, shape.head_dim)
    return {
        "q": rng.standard_normal((shape.requests, shape.q_heads, shape.head_dim)).astype(np.float32),
        "k_cache": rng.standard_normal(cache_shape, dtype=np.float32).astype(dtype),
        "v_cache": rng.standard_normal(cache_shape, dtype=np.float32).astype(dtype),
        "block_table": rng.permutation(pages).astype(np.uint32),
        "table_offsets": (np.cumsum(needed) - needed).astype(np.int32),
        "context_lens": lens,
    }


def kv_bytes(batch: dict[str, Any]) -> int:
    """Bytes of K and V a decode round must read."""
    _, _, kv_heads, head_dim = (int(n) for n in batch["k_cache"].shape)
    itemsize = int(batch["k_cache"].dtype.itemsize)
    return int(batch["context_lens"].sum()) * kv_heads * head_dim * 2 * itemsize


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """GB/s (read + written) of numpy copying `megabytes` into an already-touched array."""
    source = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    target = np.zeros_like(source)
    best = min(_timed(lambda: np.copyto(target, source)) for _ in range(repeats))
    return 2 * source.nbytes / best / 1e9


def time_best(run: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Best wall time of `repeats` runs after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    return min(_timed(run) for _ in range(repeats))


def torch_attention(batch: dict[str, Any], scale: float) -> Callable[[], npt.NDArray[np.float32]] | None:
    """The torch baseline as a callable, or None when torch is not importable."""
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError:
        return None
    k_cache = torch.from_numpy(batch["k_cache"])
    v_cache = torch.from_numpy(batch["v_cache"])
    q = torch.from_numpy(batch["q"])
    table = torch.from_numpy(batch["block_table"].astype(np.int64))
    page_size = int(batch["k_cache"].shape[1])

    kv_heads, head_dim = int(batch["k_cache"].shape[2]), int(batch["k_cache"].shape[3])
    group = int(batch["q"].shape[1]) // kv_heads

    def run() -> npt.NDArray[np.float32]:
        outputs = []
        with torch.inference_mode():
            for query, (offset, length) in enumerate(zip(batch["table_offsets"], batch["context_lens"], strict=True)):
                pages = table[int(offset) : int(offset) + (int(length) + page_size - 1) // page_size]
                keys = k_cache.index_select(0, pages).flatten(0, 1)[: int(length)].float()  # [length, kv, d]
                values = v_cache.index_select(0, pages).flatten(0, 1)[: int(length)].float()
                # A kv head's `group` query heads become its query rows: plain SDPA, no K/V repeat.
                attended = functional.scaled_dot_product_attention(
                    q[query].view(1, kv_heads, group, head_dim),
                    keys.permute(1, 0, 2).unsqueeze(0),  # [1, kv_heads, length, head_dim]
                    values.permute(1, 0, 2).unsqueeze(0),
                    scale=scale,
                )
                outputs.append(attended.reshape(kv_heads * group, head_dim))
        result: npt.NDArray[np.float32] = torch.stack(outputs).numpy()
        return result

    return run


def measure_cpu(
    shape: DecodeShape,
    dtypes: list[str],
    repeats: int,
    use_torch: bool,
    seed: int,
    log: Callable[[str], None],
    copy_megabytes: int = 256,
    command: str = "kvsched bench decode",
) -> Report:
    """The CPU table: twin, oracle and (if importable) torch, per cache dtype."""
    log("measuring memory-copy bandwidth")
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else []
    measured = measurement(command)
    report = Report(measured, asdict(shape), os.cpu_count() or 1, copy_bandwidth(copy_megabytes), load)
    rng = np.random.default_rng(seed)
    for dtype in dtypes:
        report.rows += measure_dtype(
            decode_batch(rng, shape, np.dtype(dtype)), dtype, repeats, use_torch, report.copy_gbps, log
        )
    twins = [row for row in report.rows if row.implementation == "numba twin"]
    report.targets = {
        "twin_fraction_of_copy": COPY_FRACTION_TARGET,
        "twin_speedup_vs_torch": TWIN_SPEEDUP_TARGET,
        "met_fraction_of_copy": {row.cache_dtype: row.fraction_of_copy >= COPY_FRACTION_TARGET for row in twins},
        "met_speedup_vs_torch": {
            row.cache_dtype: None if row.speedup_vs_torch is None else row.speedup_vs_torch >= TWIN_SPEEDUP_TARGET
            for row in twins
        },
    }
    return report


def measure_dtype(
    batch: dict[str, Any], dtype: str, repeats: int, use_torch: bool, copy_gbps: float, log: Callable[[str], None]
) -> list[Row]:
    """Twin, oracle and (if importable) torch on one batch; errors are against the oracle."""
    moved = kv_bytes(batch)
    scale = 1.0 / float(np.sqrt(batch["q"].shape[2]))
    args = [batch[name] for name in ops.ATTENTION_ARGS]

    def attend(device: str) -> npt.NDArray[np.float32]:
        return ops.paged_attention(*args, scale=scale, device=device)

    log(f"{dtype}: numpy oracle ({moved / 1e6:.0f} MB of K+V)")
    expected = attend("numpy")
    oracle_seconds = time_best(lambda: attend("numpy"), 1, 0)
    log(f"{dtype}: numba twin (compiles on first use)")
    got = attend("cpu")
    rows = [
        _row(dtype, "numba twin", time_best(lambda: attend("cpu"), repeats), moved, copy_gbps, got, expected),
        _row(dtype, "numpy oracle", oracle_seconds, moved, copy_gbps, expected, expected),
    ]
    baseline = torch_attention(batch, scale) if use_torch else None
    if baseline is not None:
        log(f"{dtype}: torch scaled_dot_product_attention")
        torch_seconds = time_best(baseline, repeats)
        rows.append(_row(dtype, "torch sdpa (gathered)", torch_seconds, moved, copy_gbps, baseline(), expected))
        for row in rows:
            row.speedup_vs_torch = torch_seconds / row.seconds
    return rows


def format_report(report: Report) -> str:
    """The human-readable table."""
    lines = [
        f"memory copy: {report.copy_gbps:.1f} GB/s (read + write), {report.cpu_count} CPUs, "
        f"load average {' '.join(f'{x:.1f}' for x in report.load_average)}",
        f"{'cache':<8} {'implementation':<24} {'ms':>9} {'GB/s':>8} {'of copy':>8} {'vs torch':>9} {'max err':>9}",
    ]
    for row in report.rows:
        speedup = "-" if row.speedup_vs_torch is None else f"{row.speedup_vs_torch:.2f}x"
        lines.append(
            f"{row.cache_dtype:<8} {row.implementation:<24} {row.seconds * 1e3:>9.2f} {row.gbps:>8.2f} "
            f"{row.fraction_of_copy:>7.0%} {speedup:>9} {row.max_abs_error:>9.1e}"
        )
    if report.gpu:
        gpu = report.gpu
        if "skipped" in gpu:
            lines.append(f"gpu: skipped ({gpu['skipped']})")
        else:
            lines.append(
                f"gpu {gpu['device']}: {gpu['requests']} x {gpu['context']} float16: {gpu['gbps']:.0f} GB/s, "
                f"{gpu['fraction_of_hbm_peak']:.0%} of {gpu['hbm_peak_gbps']:.0f} GB/s peak"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the bench; print the table (or, with `--json`, write the JSON)."""
    parser = CommandParser(prog="kvsched bench decode", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--json", metavar="PATH", help="write the JSON report to PATH ('-': stdout, instead of the table)"
    )
    parser.add_argument("--quick", action="store_true", help="a small shape (seconds, for smoke tests)")
    parser.add_argument("--dtypes", default="float32,float16", help="cache dtypes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-torch", action="store_true", help="skip the torch baseline even if importable")
    parser.add_argument("--gpu", action="store_true", help="also measure the CUDA kernel on a native GPU")
    parser.add_argument("--gpu-requests", type=int, default=64)
    parser.add_argument("--gpu-context", type=int, default=4096)
    parser.add_argument("--hbm-peak-gbps", type=float, default=H200_HBM_PEAK_GBPS)
    parser.add_argument("--plot", type=Path, help="also draw the GB/s as a chart at this path (.svg, .png)")
    args = parser.parse_args(argv)
    shape = DecodeShape(requests=4, min_context=64, max_context=256) if args.quick else DecodeShape()

    def log(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    for name in dtypes:
        if name not in ("float16", "float32"):
            parser.error(f"unknown cache dtype {name!r}")
    copy_megabytes = 32 if args.quick else 256  # far beyond the last-level cache either way
    command = " ".join(["kvsched bench decode", *(argv if argv is not None else sys.argv[1:])])
    report = measure_cpu(shape, dtypes, args.repeats, not args.no_torch, args.seed, log, copy_megabytes, command)
    if args.gpu:
        log(f"gpu: {args.gpu_requests} requests x {args.gpu_context} positions, float16")
        from kvsched.kernels.bench_gpu import measure_gpu

        report.gpu = measure_gpu(args.gpu_requests, args.gpu_context, args.repeats, args.hbm_peak_gbps, args.seed)
    if args.json:
        write_json(args.json, asdict(report))
    if args.json != "-":
        print(format_report(report))
    if args.plot:
        bandwidth_chart(report).write(str(args.plot))
    return 0


def bandwidth_chart(report: Report) -> BarChart:
    """GB/s of K+V read per implementation and cache dtype (log scale), against the copy bandwidth."""
    dtypes = list(dict.fromkeys(row.cache_dtype for row in report.rows))
    names = list(dict.fromkeys(row.implementation for row in report.rows))
    found = {(row.cache_dtype, row.implementation): row.gbps for row in report.rows}
    return BarChart(
        title=f"Decode attention, {report.shape['requests']} requests, contexts "
        f"{report.shape['min_context']}-{report.shape['max_context']} (CPU)",
        unit="GB/s of K+V read (log scale)",
        groups=dtypes,
        series={name: [found.get((dtype, name)) for dtype in dtypes] for name in names},
        references=[
            Reference("measured copy bandwidth", report.copy_gbps),
            Reference(f"{COPY_FRACTION_TARGET:.0%} of copy (target)", COPY_FRACTION_TARGET * report.copy_gbps),
        ],
        log_scale=True,
    )


def _row(dtype: str, name: str, seconds: float, moved: int, copy_gbps: float, got: Any, expected: Any) -> Row:
    gbps = moved / seconds / 1e9
    error = float(np.abs(np.asarray(got) - expected).max())
    return Row(dtype, name, seconds, gbps, gbps / copy_gbps, error)


def _timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
