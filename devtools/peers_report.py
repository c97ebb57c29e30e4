"""docs/bench/peers.json from one run of the peer drivers (`../shared/peers/run_all.sh`): the engine
step (W3) and admission (W2e) of vLLM's scheduler, nano-vllm's scheduler and kvsched's engine, side
by side, with the run's date, command, machine and load.

    python -m devtools.peers_report RESULTS.jsonl [--run RUN_ID] [--command TEXT] [--plot PATH]

RESULTS.jsonl is what `run_all.sh` appended (`OUT=`); the run is its newest unless `--run` names
one. Each figure is the driver's median of its repetitions, in the clock the run used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from kvsched.charts import BarChart
from kvsched.report import write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "peers.json"
PLOT = ROOT / "docs" / "bench" / "peers.svg"
COMMAND = "PEERS_SCRATCH=... KVSCHED_PY=.venv/bin/python REPS=3 CLOCK=cpu bash ../shared/peers/run_all.sh"
PEERS = ("vllm", "nano-vllm", "kvsched.impl")


def runs(lines: list[dict[str, Any]]) -> list[str]:
    """The run ids in the file, oldest first."""
    return list(dict.fromkeys(line["run_id"] for line in lines if "run_id" in line))


def pick(lines: list[dict[str, Any]], peer: str, workload: str, **match: Any) -> dict[str, Any] | None:
    """The line of `peer` for `workload` with these fields, each number the median over the run's
    repetitions (None: the peer has no such line)."""
    found = [
        line
        for line in lines
        if line.get("peer") == peer
        and line.get("workload") == workload
        and all(line.get(key) == value for key, value in match.items())
    ]
    reps = [line.get("rep") for line in found]
    if len(set(reps)) != len(reps):
        raise SystemExit(f"{len(found)} lines for {peer} {workload} {match} in one repetition of one run")
    if not found:
        return None
    combined = dict(found[0])
    for key in found[0]:
        values = [line.get(key) for line in found]
        numbers = [value for value in values if isinstance(value, int | float) and not isinstance(value, bool)]
        if len(numbers) == len(values):
            combined[key] = statistics.median(numbers)
    return combined


def w3_rows(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steady decode step at each R: every peer's µs, and kvsched's without its null model."""
    rows = []
    for requests in sorted({line["R"] for line in lines if line.get("workload") == "W3"}):
        mine = pick(lines, "kvsched.impl", "W3", R=requests)
        vllm, nano = pick(lines, "vllm", "W3", R=requests), pick(lines, "nano-vllm", "W3", R=requests)
        if mine is None or vllm is None or nano is None:
            continue
        rows.append(
            {
                "R": requests,
                "vllm_us": vllm["us_per_step"],
                "nano_us": nano["us_per_step"],
                "kvsched_us": mine["us_per_step"],
                "kvsched_model_us": mine["us_model_per_step"],
                "kvsched_excl_model_us": mine["us_per_step_excl_model"],
            }
        )
    return rows


def _sum(line: dict[str, Any] | None, *names: str) -> float | None:
    return None if line is None else sum(line[name] for name in names)


def w2e_rows(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Admission per request, construction and hashing of every page included: vLLM's scheduler
    (its Request hashes), nano-vllm's BlockManager with its Sequence (it has no engine loop here),
    and kvsched's engine per page hash (its admission hashed only the unshared pages, so the
    hashing of all 72 is added and the memoized hashing taken out)."""
    vllm = pick(lines, "vllm", "W2e")
    nano = pick(lines, "nano-vllm", "W2")
    rows = []
    hashes = dict.fromkeys(
        line["hash_algo"] for line in lines if line.get("peer") == "kvsched.impl" and line.get("workload") == "W2e"
    )
    for page_hash in hashes:
        line = pick(lines, "kvsched.impl", "W2e", hash_algo=page_hash)
        assert line is not None
        admission = line["us_per_admission"]
        construct = line["us_per_request_construct"]
        hashing = line["us_hash_per_request_72_pages"] - line["us_hash_per_request_engine_memo"]
        rows.append(
            {
                "hash": line["hash_algo"],
                "kvsched_admission_us": admission,
                "kvsched_construct_us": construct,
                "kvsched_extra_hash_us": hashing,
                "kvsched_total_us": admission + construct + hashing,
                "vllm_total_us": _sum(vllm, "us_per_admission", "us_per_request_construct_and_hash"),
                "nano_total_us": _sum(nano, "us_per_admission", "us_per_request_construct"),
            }
        )
    return rows


def _field(lines: list[dict[str, Any]], peer: str, name: str) -> Any:
    return next((line[name] for line in lines if line.get("peer") == peer and name in line), None)


def report(lines: list[dict[str, Any]], run: str | None, command: str) -> dict[str, Any]:
    ids = runs(lines)
    if not ids:
        raise SystemExit("no run in the file")
    run = run or ids[-1]
    mine = [line for line in lines if line.get("run_id") == run]
    load = [line for line in mine if line.get("workload") == "load"]
    before = next((line for line in load if line.get("when") == "before"), None)
    first = next(line for line in mine if line.get("peer") in PEERS)
    return {
        "measured": {
            "date": run.replace("T", " ").replace("Z", " UTC"),
            "command": command,
            "cpus": first.get("cpus"),
            "machine": first.get("cpu_model"),
            "load_1min": None if before is None else round(before["loadavg"][0], 2),
            "clock": first.get("clock"),
            "versions": {
                "vllm": _field(mine, "vllm", "vllm_version"),
                "nano-vllm": _field(mine, "nano-vllm", "nano_vllm_version"),
                "kvsched": _field(mine, "kvsched.impl", "kvsched_commit"),
            },
        },
        "w3": w3_rows(mine),
        "w2e": w2e_rows(mine),
    }


def chart(report: dict[str, Any]) -> BarChart:
    """µs per steady decode step of each peer at each R, on a logarithmic axis."""
    rows = report["w3"]
    return BarChart(
        title="W3: one steady decode step (prefix caching on), CPU time",
        unit="µs per step (log scale)",
        groups=[f"R = {row['R']}" for row in rows],
        series={
            "vLLM's scheduler": [row["vllm_us"] for row in rows],
            "nano-vllm's scheduler": [row["nano_us"] for row in rows],
            "kvsched's engine": [row["kvsched_us"] for row in rows],
            "kvsched's engine, null model's calls out": [row["kvsched_excl_model_us"] for row in rows],
        },
        log_scale=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.peers_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="the JSONL run_all.sh appended to")
    parser.add_argument("--run", help="the run id (default: the newest in the file)")
    parser.add_argument("--command", default=COMMAND, help="the command the run was made with")
    parser.add_argument("--json", default=str(OUT), help=f"where to write (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--plot", default=str(PLOT), help=f"the W3 chart (default {PLOT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    lines = [json.loads(text) for text in Path(args.results).read_text(encoding="utf-8").splitlines() if text.strip()]
    result = report(lines, args.run, args.command)
    write_json(args.json, result)
    chart(result).write(args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
