"""`kvsched check`'s defaults against the planted bugs: each manager on seeds 0-4 at the defaults,
what was found, after how many programs and CPU seconds, the length of the printed program, and
what the campaign exercised of the host tier and leases; every correct manager must pass every
seed.

The managers: a nano-vllm-shaped block manager with fork and copy-on-write and its two planted
copy-on-write bugs (`devtools.cow_toy`); a vLLM-shaped manager with a tenant-salted hashed prefix
cache, fork, leases and a host offload tier, and its five planted bugs (`devtools.offload_toy`);
kvsched's own parts with a host tier (`kvsched_parts:tiered`).

    python -m devtools.check_defaults [--seeds 5] [--only SUBSTRING] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvsched.report import Progress, measurement, print_table, write_json
from kvsched.testing import search_safety

CORRECT = (
    "devtools.cow_toy:correct",
    "devtools.offload_toy:correct",
    "devtools.offload_toy:asynchronous",
    "kvsched.testing.adapters.kvsched_parts:tiered",
)
MANAGERS = (
    "devtools.cow_toy:correct",
    "devtools.cow_toy:in_place",
    "devtools.cow_toy:release_first",
    "devtools.offload_toy:correct",
    *(
        f"devtools.offload_toy:{fault}"
        for fault in ("cow_above_2", "unsalted", "host_keeps_old_key", "free_drops_leases", "loaded_unkeyed")
    ),
    "devtools.offload_toy:asynchronous",
    *(
        f"devtools.offload_toy:{fault}"
        for fault in ("store_unpinned", "failed_store_keyed", "failed_load_cached", "freed_under_load")
    ),
    "kvsched.testing.adapters.kvsched_parts:tiered",
)
EXERCISED = ("promoted", "demoted", "leases_read", "hit_pages")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.check_defaults", description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", default="", help="only the managers whose MODULE:NAME contains this")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH ('-': stdout)")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["python -m devtools.check_defaults", *(argv or sys.argv[1:])]))
    rows = []
    for target in [target for target in MANAGERS if args.only in target]:
        module, name = target.split(":")
        factory = getattr(importlib.import_module(module), name)
        for seed in range(args.seeds):
            with Progress(f"{target} seed {seed}", 1000) as progress:
                result = search_safety(
                    factory,
                    seed_value=seed,
                    source=(module, name),
                    progress=lambda done, shrinking: progress.update(done, "shrinking" if shrinking else ""),
                )
            rows.append(
                {
                    "manager": target.rsplit(".", 1)[-1],
                    "seed": seed,
                    "found": None if result.failure is None else result.failure.kind.name,
                    "programs": result.programs,
                    "program_calls": result.program_steps,
                    "cpu_seconds": round(result.seconds, 2),
                    **{counter: result.coverage[counter] for counter in EXERCISED},
                }
            )
    if args.json:
        write_json(args.json, {"measured": measured, "rows": rows})
    if args.json != "-" and rows:
        print_table([list(row.values()) for row in rows], list(rows[0]))
    correct = {target.rsplit(".", 1)[-1] for target in CORRECT}
    return 0 if all(row["found"] is None for row in rows if row["manager"] in correct) else 1


if __name__ == "__main__":
    sys.exit(main())
