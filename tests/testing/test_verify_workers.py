"""`kvsched verify --workers`: each campaign cut into shards of seeds gives the same table and the
same counterexample on 1 and 2 worker processes; a mistake is exit 2. (The passing campaigns go
the same way; a broken variant is the stronger case: its counts and its shrunk program agree.)"""

from __future__ import annotations

import pytest

from kvsched.cli import main
from kvsched.testing.campaign import CampaignResult
from kvsched.testing.verify_shards import run_sharded

FIFO = "pages reused first-in-first-out"


def counts(rows: list[CampaignResult]) -> list[tuple[object, ...]]:
    """A campaign's row without its seconds."""
    return [(row.machine, row.examples, row.steps, row.invariant_checks, row.counterexample) for row in rows]


def test_a_broken_variant_fails_with_the_same_program_on_one_worker_and_two() -> None:
    one = run_sharded(FIFO, examples=10, steps=8, seed=0, workers=1, shard=5)
    assert one[0].counterexample is not None and "state = KvschedMachine" in one[0].counterexample
    assert one[0].examples >= 10 and one[0].invariant_checks > 0
    assert counts(run_sharded(FIFO, examples=10, steps=8, seed=0, workers=2, shard=5)) == counts(one)


@pytest.mark.parametrize("mistake", [["--workers", "0"], ["--workers", "2", "--shard", "0"]])
def test_a_sharding_mistake_is_exit_2(mistake: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--no-proofs", *mistake]) == 2
    assert "kvsched verify:" in capsys.readouterr().err
