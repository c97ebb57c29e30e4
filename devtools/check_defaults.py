"""`kvsched check`'s defaults against the planted copy-on-write bugs (`devtools.cow_toy`): each
manager on seeds 0-4 at the defaults, what was found, after how many programs and CPU seconds,
and the length of the printed program; the correct manager must pass every seed.

    python -m devtools.check_defaults [--seeds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

from devtools import cow_toy
from kvsched.report import Progress, measurement, print_table, write_json
from kvsched.testing import search_safety

MANAGERS = ("correct", "in_place", "release_first")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.check_defaults", description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH ('-': stdout)")
    args = parser.parse_args(argv)
    measured = measurement(" ".join(["python -m devtools.check_defaults", *(argv or sys.argv[1:])]))
    rows = []
    for name in MANAGERS:
        for seed in range(args.seeds):
            with Progress(f"{name} seed {seed}", 1000) as progress:
                result = search_safety(
                    getattr(cow_toy, name),
                    seed_value=seed,
                    source=("devtools.cow_toy", name),
                    progress=lambda done, shrinking: progress.update(done, "shrinking" if shrinking else ""),
                )
            rows.append(
                {
                    "manager": name,
                    "seed": seed,
                    "found": None if result.failure is None else result.failure.kind.name,
                    "programs": result.programs,
                    "program_calls": result.program_steps,
                    "cpu_seconds": round(result.seconds, 2),
                }
            )
    if args.json:
        write_json(args.json, {"measured": measured, "rows": rows})
    if args.json != "-":
        print_table([list(row.values()) for row in rows], list(rows[0]))
    correct = all(row["found"] is None for row in rows if row["manager"] == "correct")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
