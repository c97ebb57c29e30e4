"""A safety campaign cut into shards of seeds, for many workers (`kvsched check --workers`).

A campaign of `examples` programs at seed `seed` becomes shards of at most `shard` programs:
shard j is the plain campaign `kvsched check TARGET --examples n_j --seed seed + j`, so each shard
can be run again alone, and the cut does not depend on how many workers run it. Each shard runs
every program it draws (and shrinks its own counterexample); the campaign then merges them:

    programs, coverage   summed over the shards
    verdict              failed when any shard failed
    counterexample       the shortest any shard found (fewest calls, then the lowest seed),
                         replayed here, once, from its shard alone: it must fail the same way
    warnings             from the merged coverage, as one campaign's

So for the same seeds the verdict and the printed program are the same on 1 worker, N workers
or a Ray cluster. A journal (`--journal FILE`, one JSON line per finished shard) lets a stopped
campaign resume: the shards it holds are not run again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kvsched.testing.outcome import CheckFailure, FailureKind
from kvsched.testing.safety import COVERAGE
from kvsched.testing.safety_search import POOL_SIZES, SafetyResult, coverage_warnings, search_safety
from kvsched.testing.workers import run_shards, shard_sizes


class ForeignJournal(ValueError):
    """A journal line of another campaign (other seeds, target or settings)."""


SHARD = 100  # programs per shard: a few seconds of a small manager's campaign, so a task's start is noise


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard: the plain campaign of `examples` programs at `seed` over `target`'s managers."""

    index: int
    target: str  # MODULE:FACTORY, imported by the worker
    examples: int
    seed: int
    steps: int
    pages: int | None
    page_size: int
    shrinks: int

    @property
    def campaign(self) -> str:
        """What makes its results comparable with another shard's: the target and the settings."""
        return f"{self.target} steps={self.steps} pages={self.pages} page_size={self.page_size} shrinks={self.shrinks}"


@dataclass(frozen=True, slots=True)
class ShardResult:
    """What one shard found (a JSON line of the journal)."""

    index: int
    seed: int
    examples: int
    programs: int
    cpu_seconds: float
    coverage: dict[str, int]
    check: str | None = None  # the failed check's `FailureKind` name
    detail: str | None = None
    program: str | None = None
    program_steps: int = 0
    campaign: str = ""  # the shard's `Shard.campaign`


def plan(
    target: str,
    *,
    examples: int,
    seed: int,
    steps: int,
    pages: int | None,
    page_size: int,
    shrinks: int,
    shard: int = SHARD,
) -> list[Shard]:
    """The campaign's shards, in seed order."""
    sizes = shard_sizes(examples, shard)
    return [
        Shard(index, target, size, seed + index, steps, pages, page_size, shrinks) for index, size in enumerate(sizes)
    ]


def run_shard(shard: Shard) -> ShardResult:
    """Run one shard (in a worker): its plain campaign."""
    from kvsched.testing.check_command import resolve

    module, name, factory = resolve(shard.target)
    result = search_safety(
        factory,
        examples=shard.examples,
        steps=shard.steps,
        seed_value=shard.seed,
        pages=shard.pages,
        page_size=shard.page_size,
        shrinks=shard.shrinks,
        source=(module, name),
    )
    failure = result.failure
    return ShardResult(
        shard.index,
        shard.seed,
        shard.examples,
        result.programs,
        round(result.seconds, 3),
        result.coverage,
        None if failure is None else failure.kind.name,
        None if failure is None else failure.detail,
        result.program,
        result.program_steps,
        shard.campaign,
    )


@dataclass(slots=True)
class Tally:
    """The campaign so far, for its progress line."""

    shards: int
    done: int = 0
    programs: int = 0
    findings: int = 0
    started: float = 0.0
    resumed: int = 0  # programs read back from the journal (not run now: not in the rate)

    def line(self, workers: str) -> str:
        rate = (self.programs - self.resumed) / max(time.monotonic() - self.started, 1e-9)
        return (
            f"{self.done} of {self.shards} shards, {self.programs} programs ({rate:.0f}/s), "
            f"{workers}, {self.findings} finding{'s' * (self.findings != 1)}"
        )


def run_campaign(
    shards: list[Shard],
    factory: Any,
    *,
    workers: int = 1,
    ray: str | None = None,
    journal: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[SafetyResult, list[ShardResult]]:
    """Run `shards` (from `plan`) over `workers` processes or Ray, resuming from `journal`; the
    merged result (as one campaign's, `seed` its first shard's) and every shard's."""
    results: dict[int, ShardResult] = {result.index: result for result in _read(journal, shards)}
    tally = Tally(len(shards), len(results), sum(result.programs for result in results.values()))
    tally.findings = sum(result.check is not None for result in results.values())
    tally.resumed = tally.programs
    tally.started = time.monotonic()
    where = f"Ray ({ray})" if ray is not None else f"{workers} worker{'s' * (workers != 1)}"

    def done(position: int, result: ShardResult) -> None:
        results[result.index] = result
        tally.done += 1
        tally.programs += result.programs
        tally.findings += result.check is not None
        if journal is not None:
            with journal.open("a") as lines:
                lines.write(json.dumps(asdict(result)) + "\n")
        if progress is not None:
            progress(tally.line(where))

    todo = [shard for shard in shards if shard.index not in results]
    if progress is not None:
        progress(tally.line(where))
    run_shards(run_shard, todo, done, workers=workers, ray=ray)
    ordered = [results[shard.index] for shard in shards]
    return merge(shards, ordered, factory), ordered


def merge(shards: list[Shard], results: list[ShardResult], factory: Any) -> SafetyResult:
    """The campaign as one: summed, its shortest counterexample replayed from its shard alone."""
    first = shards[0]
    coverage: Counter[str] = Counter({counter: 0 for counter in COVERAGE})
    for result in results:
        coverage.update(result.coverage)
    probe = factory(first.pages if first.pages is not None else POOL_SIZES[0], first.page_size)
    examples = sum(shard.examples for shard in shards)
    merged = SafetyResult(
        first.target,
        sum(result.programs for result in results),
        first.steps,
        first.seed,
        sum(result.cpu_seconds for result in results),
        coverage=dict(coverage),
        warnings=coverage_warnings(probe, dict(coverage), examples),
    )
    failed = [result for result in results if result.check is not None]
    if not failed:
        return merged
    shortest = min(failed, key=lambda result: (result.program_steps, result.seed))
    replayed = run_shard(shards[shortest.index])
    if (replayed.check, replayed.program) != (shortest.check, shortest.program):
        raise RuntimeError(
            f"shard {shortest.index} (seed {shortest.seed}) did not fail the same way alone: the manager's verdict"
            " depends on more than the seed (time, threads, state outside the factory's managers)"
        )
    assert shortest.check is not None and shortest.detail is not None
    failure = CheckFailure(FailureKind[shortest.check], shortest.detail)
    return replace(merged, failure=failure, program=shortest.program, program_steps=shortest.program_steps)


def _read(journal: Path | None, shards: list[Shard]) -> list[ShardResult]:
    """The journal's results for these shards (a line for another campaign's shard is an error)."""
    if journal is None or not journal.exists():
        return []
    results = []
    for number, line in enumerate(journal.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        result = ShardResult(**json.loads(line))
        shard = shards[result.index] if 0 <= result.index < len(shards) else None
        if shard is None or (shard.seed, shard.examples, shard.campaign) != (
            result.seed,
            result.examples,
            result.campaign,
        ):
            other = f"{result.campaign}, seed {result.seed}"
            raise ForeignJournal(f"{journal}:{number}: a shard of another campaign ({other})")
        results.append(result)
    return results
