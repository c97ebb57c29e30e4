"""Compare vLLM's tests run stock and over kvsched's pool (two JUnit XML reports).

Every test that passes stock must pass over kvsched, except those named in the exclusion list
(`exclusions/RELEASE/pool.txt` or `checker.txt`: one test id per line, `#` comments, each under a
heading that says why). An
excluded test that passes anyway, or that no longer exists, is reported so the list stays
short (one that passes over kvsched fails the comparison).
`--expect-failures` inverts the verdict for a wrong reserve: it must fail at least one
test that passes stock. Prints the counts; exits 1 when the verdict is a failure.

    python compare_runs.py STOCK.xml KVSCHED.xml --exclusions FILE [--expect-failures] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(report: Path) -> dict[str, str]:
    """Test id (`file::name`) to passed, failed, error or skipped."""
    results: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = next((kind for kind in ("failure", "error", "skipped") if kind in kinds), "passed")
        results[test_id] = {"failure": "failed"}.get(outcome, outcome)
    return results


def exclusions(path: Path) -> dict[str, str]:
    """Excluded test id to the reason heading it stands under."""
    reason = ""
    excluded: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("#"):
            reason = line.lstrip("# ").strip() or reason
        elif line:
            excluded[line] = reason
    return excluded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stock", type=Path)
    parser.add_argument("kvsched", type=Path)
    parser.add_argument("--exclusions", type=Path, required=True)
    parser.add_argument("--expect-failures", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    stock, ours = outcomes(args.stock), outcomes(args.kvsched)
    excluded = exclusions(args.exclusions)
    stock_passed = {test for test, outcome in stock.items() if outcome == "passed"}
    if args.expect_failures:  # a wrong reserve runs some files only: compare those
        stock_passed &= set(ours)
    lost = sorted(test for test in stock_passed if ours.get(test) != "passed")
    unexplained = [test for test in lost if test not in excluded]
    excused = [test for test in lost if test in excluded]
    stale = sorted(test for test in excluded if test not in lost and (test in ours or not args.expect_failures))
    summary = {
        "stock_tests": len(stock),
        "stock_passed": len(stock_passed),
        "kvsched_passed_of_stock_passed": len(stock_passed) - len(lost),
        "excluded_failing": len(excused),
        "unexplained_failures": unexplained,
        "excluded_but_passing_or_absent": stale,
    }
    print(
        f"stock: {len(stock_passed)} of {len(stock)} pass; over kvsched: {summary['kvsched_passed_of_stock_passed']}"
        f" of those pass; {len(excused)} fail and are excluded; {len(unexplained)} fail unexplained"
    )
    for test in unexplained:
        print(f"  FAILS OVER KVSCHED: {test} ({ours.get(test, 'absent')})")
    for test in stale:
        print(f"  excluded but {'absent' if test not in stock_passed else 'passing'}: {test}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if args.expect_failures:
        caught = unexplained
        print(f"wrong reserve: {len(caught)} tests that pass stock fail over it")
        return 0 if caught else 1
    needless = [test for test in stale if ours.get(test) == "passed"]
    return 1 if unexplained or needless else 0


if __name__ == "__main__":
    sys.exit(main())
