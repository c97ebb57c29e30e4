"""Record SGLang's answers to the harness, for CI to replay without SGLang (`make sglang`).

For each shipped adapter, `--programs` seeded random programs of the harness's calls (the
campaign's prompts and verbs), each run over `Recorder(adapter)`: every one must pass. For each
broken variant, its pinned program: it must fail with the check the variant names. Each trace
is written under OUT as `<name>.json.gz` (a list of traces: `kvsched.testing.adapters.recorded`).

    python -m devtools.sglang.record_traces OUT [--programs 40] [--steps 30]   (SGLang's venv)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from kvsched.testing.adapters import sglang, sglang_hybrid, sglang_mamba, sglang_window
from kvsched.testing.adapters.recorded import record, record_programs, run_pinned, write

ADAPTERS = (
    ("radix_token", sglang.radix_token, 1),
    ("radix_paged", sglang.radix_paged, 2),
    ("unified_token", sglang.unified_token, 1),
    ("unified_paged", sglang.unified_paged, 2),
    ("unified_rust_token", sglang.unified_rust_token, 1),
    ("unified_rust_paged", sglang.unified_rust_paged, 2),
    ("pure_swa_prefill_aware", sglang_window.pure_swa_prefill_aware, 1),
    ("hybrid_swa", sglang_hybrid.hybrid_swa, 1),
    ("hybrid_mamba", sglang_mamba.hybrid_mamba, 1),
    ("hybrid_swa_mamba", sglang_mamba.hybrid_swa_mamba, 1),
)
AT_LEAST = {"hybrid_swa_mamba": 80}  # a hit must serve both a window and a snapshot: 40 programs hold none


def main(argv: list[str] | None = None) -> int:
    from devtools.sglang.variants import FOUND, VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for name, factory, page_size in ADAPTERS:
        traces = record_programs(name, factory, page_size, max(args.programs, AT_LEAST.get(name, 0)), args.steps)
        ok &= all(trace["verdict"] == "pass" for trace in traces)
        write(args.out / f"{name}.json.gz", traces)
    for variant in VARIANTS + FOUND:
        pinned = functools.partial(run_pinned, lines=variant.program)
        trace = record(variant.name, variant.factory, variant.pages, variant.page_size, pinned)
        caught = trace["verdict"] == variant.caught_by.name
        ok &= caught
        print(f"{variant.name}: pinned program {trace['verdict']} (expected {variant.caught_by.name})", file=sys.stderr)
        write(args.out / f"{variant.name}.json.gz", [trace])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
