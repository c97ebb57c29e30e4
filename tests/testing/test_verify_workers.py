"""`kvsched verify --workers`: each campaign cut into shards of seeds gives the same table and the
same counterexample on 1 and 2 worker processes; a mistake is exit 2. (The passing campaigns go
the same way; a broken variant is the stronger case: its counts and its shrunk program agree.)"""

from __future__ import annotations

import pytest

from kvsched.cli import main
from kvsched.testing.campaign import CampaignResult
from kvsched.testing.verify_shards import merge, plan, run_sharded

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


def test_the_last_shard_is_planned_and_merged() -> None:
    """12 programs in shards of 5: the last shard (2 programs, seed 2) is planned, and the merge
    sums every shard, the last one included."""
    shards = plan(0, None, examples=12, seed=0, steps=4, shard=5)
    assert [(shard.examples, shard.seed) for shard in shards] == [(5, 0), (5, 1), (2, 2)]
    rows = [CampaignResult("m", examples, 4 * examples, 10 * examples, 0, 1.0, None) for examples in (5, 5, 2)]
    merged = merge(shards, rows, 3.0)
    assert (merged.examples, merged.steps, merged.invariant_checks, merged.counterexample) == (12, 48, 120, None)
