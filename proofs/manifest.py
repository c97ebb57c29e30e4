"""MANIFEST.json: what each proof run covered, so a reader sees the bounds behind a claim.

One record per run (the latest run of each name and profile replaces the previous one, and a
profile run in full replaces all of that profile's records): the bounds, the states and
transitions explored or the goals proved, the invariants checked, the outcome and the time, on
which machine and when.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvsched.proofs.explorer import Exploration
from kvsched.proofs.inductive import GoalResult, times_by_transition
from kvsched.proofs.invariant import CONJUNCTS

MANIFEST = Path("MANIFEST.json")  # in the current directory; this checkout records to proofs/MANIFEST.json


def _stamp() -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": f"{platform.node()} ({platform.machine()})"}


def exploration_record(result: Exploration, profile: str, name: str) -> dict[str, Any]:
    """The manifest record of one explorer run, under the name of its summary row."""
    return {
        "kind": "explore",
        "name": name,
        "subject": result.subject,
        "reference": result.reference,
        "profile": profile,
        "bounds": asdict(result.bounds),
        "states": result.states,
        "transitions": result.transitions,
        "depth": result.depth,
        "complete": result.complete,
        "invariants": list(result.invariants),
        "checks": result.checks,
        "outcome": "pass" if result.violation is None else f"FAIL ({result.violation.kind})",
        "seconds": round(result.seconds, 2),
        "states_per_second": round(result.states_per_second),
        **_stamp(),
    }


def proof_record(results: list[GoalResult], seconds: float, profile: str) -> dict[str, Any]:
    """The manifest record of one run of the inductive proofs."""
    table = times_by_transition(results)
    return {
        "kind": "inductive",
        "name": "z3 inductive proofs",
        "profile": profile,
        "bounds": "every size (symbolic pages, slots, table width, store entries)",
        "goals": len(results),
        "transitions": {
            name: {"goals": goals, "seconds": round(secs, 4), "proved": proved}
            for name, (goals, secs, proved) in table.items()
        },
        "invariants": [f"{c.name} ({c.label})" for c in CONJUNCTS],
        "outcome": "pass" if all(r.outcome == "proved" for r in results) else "FAIL",
        "seconds": round(seconds, 2),
        **_stamp(),
    }


def load(path: Path = MANIFEST) -> list[dict[str, Any]]:
    """The recorded runs (none when the file is missing)."""
    if not path.exists():
        return []
    runs: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8")).get("runs", [])
    return runs


def record(records: list[dict[str, Any]], path: Path = MANIFEST, whole: str | None = None) -> None:
    """Add runs, replacing earlier runs of the same name and profile.

    `whole` names a profile that just ran in full: its earlier runs are all dropped, so runs
    the profile no longer makes do not linger.
    """
    keys = {(r["name"], r["profile"]) for r in records}
    runs = [r for r in load(path) if (r["name"], r["profile"]) not in keys and r["profile"] != whole] + records
    payload = {"generated_by": "python -m kvsched.proofs", "runs": runs}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
