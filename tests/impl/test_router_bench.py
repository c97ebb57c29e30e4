"""`kvsched bench router`'s faults: the index sees the restart and the dropped batch and claims no
page an engine does not hold; a naive index (no epochs, numbers or resets) claims some. Every
answer is checked against the request run alone inside the bench."""

from __future__ import annotations

from kvsched.impl.router_bench import run


def test_the_index_survives_a_restart_and_a_dropped_batch() -> None:
    faults = run("prefix, faults")
    assert faults.verdicts.get("restarted") == 1 and faults.verdicts.get("gap") == 1
    assert faults.verdicts.get("resynced") == 1 and faults.phantom_pages == 0
    assert run("naive, faults").phantom_pages > 0
