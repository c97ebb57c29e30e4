"""Record vLLM's hybrid `KVCacheManager`'s answers to the harness, for CI to replay without vLLM
(`make vllm`): for each hybrid adapter (a full-attention group with a sliding window, or with
chunked local attention; speculative decoding), `--programs` seeded random programs of the
harness's calls, every one of which must pass; for each broken one, its pinned program, which
must fail with its check. Written under OUT as `<name>.json.gz` (`kvsched.testing.adapters.recorded`).

    python -m devtools.vllm.record_hybrid OUT [--programs 40] [--steps 30]   (vLLM's venv)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from kvsched.testing.adapters import vllm
from kvsched.testing.adapters.recorded import record, record_programs, run_pinned, write

PAGE_SIZE = 2
ADAPTERS = (("hybrid_manager", vllm.hybrid_manager), ("chunked_manager", vllm.chunked_manager))
PINNED = {  # a broken manager, the program that shows it, the check it fails
    "early_window": (vllm.early_window, ("machine.submit(1, (0, 0, 1, 0))", "machine.decode(1)"), "GHOST"),
    "drafts_as_tokens": (
        vllm.drafts_as_tokens,
        ("machine.submit(1, (0, 0, 1))", "machine.speculate(1, 2, 0)", "machine.decode(1)", "machine.decode(1)"),
        "GHOST",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--programs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for name, factory in ADAPTERS:
        traces = record_programs(name, factory, PAGE_SIZE, args.programs, args.steps)
        ok &= all(trace["verdict"] == "pass" for trace in traces)
        write(args.out / f"vllm_{name}.json.gz", traces)
    for name, (factory, lines, check) in PINNED.items():
        pinned = functools.partial(run_pinned, lines=lines)
        trace = record(name, factory, 8, PAGE_SIZE, pinned)
        ok &= trace["verdict"] == check
        print(f"{name}: pinned program {trace['verdict']} (expected {check})", file=sys.stderr)
        write(args.out / f"vllm_{name}.json.gz", [trace])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
