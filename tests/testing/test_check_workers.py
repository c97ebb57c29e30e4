"""`kvsched check --workers N`: a campaign cut into shards of seeds gives the same verdict, the
same printed program and the same counts on one worker and on many; a worker that dies has its
shard run again and changes nothing; a journal resumes a stopped campaign; Ray is never imported
unless asked for; every mistake exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devtools import cow_toy
from kvsched.cli import main
from kvsched.testing import campaign_shards
from kvsched.testing.workers import WorkerLost, run_shards

HERE = "tests.testing.test_check_workers"
DIE_FIRST = "KVSCHED_TEST_DIE_FIRST"  # a marker file: the first factory call that finds it absent dies
SAME = ("outcome", "programs", "steps", "seeds", "shards", "check", "detail", "program_steps", "program", "coverage")


def dying(pages: int, page_size: int) -> cow_toy.CowAdapter:
    """The correct copy-on-write toy, whose first call in a campaign kills its process (once:
    it leaves a marker file behind)."""
    marker = Path(os.environ[DIE_FIRST])
    if not marker.exists():
        marker.write_text("died once")
        os._exit(3)
    return cow_toy.correct(pages, page_size)


def always_dying(pages: int, page_size: int) -> cow_toy.CowAdapter:
    """A factory that kills its process every time."""
    os._exit(3)


def checked(tmp_path: Path, name: str, *options: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = main(["check", *options, "--json", str(out)])
    return code, json.loads(out.read_text())


def test_one_worker_and_two_give_the_same_verdict_program_and_counts(tmp_path: Path) -> None:
    """Seeds 5 and 9 find the planted bug (in 20 programs each), so the program printed is the
    shortest of several, and its shard alone, a plain campaign, prints it too."""
    options = ("devtools.cow_toy:in_place", "--examples", "100", "--shard", "20", "--seed", "5", "--shrinks", "300")
    one_code, one = checked(tmp_path, "one", *options, "--workers", "1")
    two_code, two = checked(tmp_path, "two", *options, "--workers", "2")
    assert one_code == two_code == 1
    assert one["check"] == "EXCLUSIVE"
    assert {key: one[key] for key in SAME} == {key: two[key] for key in SAME}
    assert (one["workers"], two["workers"], one["shards"], one["seeds"]) == (1, 2, 5, "5..9")
    code, alone = checked(
        tmp_path, "alone", "devtools.cow_toy:in_place", "--examples", "20", "--seed", "5", "--shrinks", "300"
    )
    assert code == 1 and (alone["program"], alone["program_steps"]) == (one["program"], one["program_steps"])


def test_the_counterexample_is_the_shortest_any_shard_found() -> None:
    shards = campaign_shards.plan(
        "devtools.cow_toy:in_place", examples=40, seed=8, steps=30, pages=None, page_size=2, shrinks=300, shard=20
    )
    results = [
        campaign_shards.ShardResult(0, 8, 20, 20, 0.1, {}, "EXCLUSIVE", "later", "long = 1", 5),
        campaign_shards.ShardResult(1, 9, 20, 20, 0.1, {}, None),
    ]
    with pytest.raises(RuntimeError, match="did not fail the same way alone"):  # seed 8 finds nothing alone
        campaign_shards.merge(shards, results, cow_toy.in_place)
    found = campaign_shards.run_shard(shards[1])
    assert found.check == "EXCLUSIVE"
    merged = campaign_shards.merge(shards, [results[0], found], cow_toy.in_place)
    assert merged.program == found.program and merged.program_steps == found.program_steps < 5


def test_a_worker_that_dies_has_its_shard_run_again_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "died"
    monkeypatch.setenv(DIE_FIRST, str(marker))
    options = ("--examples", "40", "--shard", "20", "--workers", "2")
    code, survived = checked(tmp_path, "survived", f"{HERE}:dying", *options)
    assert marker.exists(), "no worker died: the test did not test anything"
    _, lived = checked(tmp_path, "lived", f"{HERE}:dying", *options)  # the marker is there: nobody dies
    assert code == 0
    assert {key: survived[key] for key in SAME} == {key: lived[key] for key in SAME}


def test_a_shard_that_kills_its_worker_every_time_is_named() -> None:
    shards = campaign_shards.plan(
        f"{HERE}:always_dying", examples=2, seed=0, steps=3, pages=4, page_size=2, shrinks=10, shard=1
    )
    with pytest.raises(WorkerLost, match="its worker died 2 times"):
        run_shards(campaign_shards.run_shard, shards, lambda index, result: None, workers=2, attempts=2)


def test_a_journal_resumes_a_stopped_campaign_where_it_stopped(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    shards = campaign_shards.plan(
        "devtools.cow_toy:correct", examples=60, seed=5, steps=30, pages=None, page_size=2, shrinks=1500, shard=20
    )
    whole, _ = campaign_shards.run_campaign(shards, cow_toy.correct, workers=2, journal=journal)
    lines = journal.read_text().splitlines()
    assert len(lines) == 3
    journal.write_text("\n".join(line for line in lines if json.loads(line)["index"] != 1) + "\n")  # stopped
    seen: list[str] = []
    resumed, _ = campaign_shards.run_campaign(shards, cow_toy.correct, workers=1, journal=journal, progress=seen.append)
    assert seen[0].startswith("2 of 3 shards") and seen[-1].startswith("3 of 3 shards")
    assert (resumed.programs, resumed.coverage, resumed.passed) == (whole.programs, whole.coverage, True)
    other = campaign_shards.plan(
        "devtools.cow_toy:correct", examples=60, seed=9, steps=30, pages=None, page_size=2, shrinks=1500, shard=20
    )
    with pytest.raises(ValueError, match="a shard of another campaign"):
        campaign_shards.run_campaign(other, cow_toy.correct, journal=journal)
    another_target = [replace(shard, target="devtools.cow_toy:in_place") for shard in shards]
    with pytest.raises(ValueError, match="a shard of another campaign"):
        campaign_shards.run_campaign(another_target, cow_toy.in_place, journal=journal)


def test_ray_is_never_imported_unless_asked_for(tmp_path: Path) -> None:
    """A child process where importing Ray fails loudly runs a sharded campaign."""
    program = (
        "import sys\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise AssertionError('ray imported')\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "from kvsched.cli import main\n"
        "sys.exit(main(['check', 'devtools.cow_toy:correct', '--examples', '20', '--workers', '1']))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--workers", "0"], "--workers and --shard must be at least 1"),
        (["--shard", "0"], "--workers and --shard must be at least 1"),
        (["--workers", "2", "--ray", "auto"], "--workers or --ray, not both"),
        (["--mode", "exact", "--workers", "2"], "--workers: safety mode only"),
    ],
)
def test_a_mistake_in_the_sharding_options_exits_2(
    options: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "devtools.cow_toy:correct", *options]) == 2
    assert says in capsys.readouterr().err


def test_ray_asked_for_without_ray_installed_exits_2_naming_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # importing it raises ImportError, installed or not
    assert main(["check", "devtools.cow_toy:correct", "--examples", "20", "--ray", "local"]) == 2
    assert "pip install 'kvsched[ray]'" in capsys.readouterr().err


@pytest.mark.ray
def test_a_local_ray_cluster_gives_the_verdict_and_program_of_one_worker(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="make ray installs kvsched[ray] and runs this")
    options = ("devtools.cow_toy:in_place", "--examples", "100", "--shard", "20", "--seed", "5")
    _, one = checked(tmp_path, "one", *options, "--workers", "1")
    code, ray = checked(tmp_path, "ray", *options, "--ray", "local")
    assert code == 1
    assert {key: one[key] for key in SAME} == {key: ray[key] for key in SAME}
