"""Machine-checked proofs of kvsched's invariants, and an exhaustive bounded model checker.

Inductive proofs (z3, every size): model.py (the state), invariant.py (the invariant),
transitions.py and store_steps.py (the spec's transitions), obligations.py and inductive.py
(what is proved and how), universe.py (symbolic or small states), broken.py (encodings that
must fail), encode.py and conformance.py (the model tied to the spec's code).

Exhaustive exploration (the real spec objects, small bounds): operations.py (the alphabet),
canon.py (symmetry reduction), subject.py (system factories), explorer.py (breadth-first
search and its checks), trace.py (counterexamples as programs), manifest.py (MANIFEST.json).

runner.py ties them together; `main` and `summary_rows` are importable from here.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy: importing one module of the package must not start z3 and the whole explorer.
    if name in ("main", "summary_rows"):
        from kvsched.proofs import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'kvsched.proofs' has no attribute {name!r}")
