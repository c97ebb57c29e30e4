"""`kvsched verify`'s campaigns, and each cut into shards of seeds for many workers
(`kvsched verify --workers N` or `--ray ADDRESS`).

A campaign of `examples` programs at seed `seed` becomes shards of at most `shard` programs:
shard j is the plain campaign of its size at seed `seed + j`, so the cut does not depend on how
many workers run it, and any shard can be run again alone. Every shard runs (and shrinks its own
counterexample); the campaign then merges them: programs, steps and invariant checks summed, the
verdict failed when any shard failed, and the counterexample the shortest any shard found (fewest
lines, then the lowest seed), run again from its shard alone before it is reported. So for the
same seeds the table's counts, the verdict and the printed program are the same on 1 worker, N
workers or a Ray cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvsched.testing.campaign import CampaignResult, run_campaign
from kvsched.testing.impl_system import impl_system
from kvsched.testing.system import spec_system
from kvsched.testing.variants import VARIANTS
from kvsched.testing.workers import Workers, shard_sizes

SHARD = 50  # programs per shard: seconds of work, so a task's start is noise beside it
SPEC_SETUP = "from kvsched.testing.system import spec_system"
IMPL_SETUP = "from kvsched.testing.impl_system import impl_system"

Campaign = tuple[str, Any, Any, str]  # name, factory, reference, the reproduction's setup


def campaigns(variant: str | None) -> list[Campaign]:
    """`kvsched verify`'s campaigns: the spec alone and impl in lockstep, or a broken variant."""
    if variant is not None:
        setup = f"from kvsched.testing.variants import VARIANTS\nfactory, reference = VARIANTS[{variant!r}], None"
        return [(f"spec variant: {variant}", VARIANTS[variant], None, setup)]
    return [
        (
            "spec (invariants, atomicity, ghost reads)",
            spec_system,
            None,
            f"{SPEC_SETUP}\nfactory, reference = spec_system, None",
        ),
        (
            "impl ⇄ spec lockstep",
            impl_system,
            spec_system,
            f"{SPEC_SETUP}\n{IMPL_SETUP}\nfactory, reference = impl_system, spec_system",
        ),
    ]


@dataclass(frozen=True, slots=True)
class VerifyShard:
    """One shard: `examples` programs of campaign `campaign` (its index in `campaigns(variant)`)
    at `seed`."""

    campaign: int
    variant: str | None
    index: int
    examples: int
    seed: int
    steps: int


def plan(campaign: int, variant: str | None, *, examples: int, seed: int, steps: int, shard: int) -> list[VerifyShard]:
    """A campaign's shards, in seed order."""
    sizes = shard_sizes(examples, shard)
    return [VerifyShard(campaign, variant, index, size, seed + index, steps) for index, size in enumerate(sizes)]


def run_shard(shard: VerifyShard) -> CampaignResult:
    """One shard's plain campaign (in a worker), silent."""
    name, factory, reference, setup = campaigns(shard.variant)[shard.campaign]
    return run_campaign(
        name,
        factory,
        reference,
        examples=shard.examples,
        steps=shard.steps,
        random_seed=shard.seed,
        setup=setup,
        progress=lambda _: None,
    )


def merge(shards: list[VerifyShard], results: list[CampaignResult], seconds: float) -> CampaignResult:
    """The campaign as one: summed, its shortest counterexample run again from its shard alone."""
    first = results[0]
    counterexample = None
    failed = [
        (result.counterexample.count("\n"), shard.seed, shard, result)
        for shard, result in zip(shards, results, strict=True)
        if result.counterexample
    ]
    if failed:
        _, _, shard, shortest = min(failed, key=lambda found: found[:2])
        again = run_shard(shard)
        if again.counterexample != shortest.counterexample:
            raise RuntimeError(f"shard {shard.index} (seed {shard.seed}) did not fail the same way alone")
        counterexample = shortest.counterexample
    return CampaignResult(
        first.machine,
        sum(result.examples for result in results),
        sum(result.steps for result in results),
        sum(result.invariant_checks for result in results),
        sum(result.decoded_tokens for result in results),
        seconds,
        counterexample,
    )


def run_sharded(
    variant: str | None,
    *,
    examples: int,
    steps: int,
    seed: int,
    workers: int = 1,
    ray: str | None = None,
    shard: int = SHARD,
    progress: Callable[[str], None] | None = None,
    only: Sequence[int] | None = None,
) -> list[CampaignResult]:
    """Every campaign (or those at the indexes `only` names), each cut into shards run by
    `workers` processes (or Ray); merged rows, in the campaigns' order."""
    indexes = range(len(campaigns(variant))) if only is None else only
    with Workers(workers, ray=ray) as pool:  # one pool for every campaign
        return [
            _run_campaign(pool, plan(index, variant, examples=examples, seed=seed, steps=steps, shard=shard), progress)
            for index in indexes
        ]


def _run_campaign(pool: Workers, shards: list[VerifyShard], progress: Callable[[str], None] | None) -> CampaignResult:
    """One campaign's shards on `pool`, merged."""
    name = campaigns(shards[0].variant)[shards[0].campaign][0]
    results: list[CampaignResult | None] = [None] * len(shards)
    started = time.perf_counter()

    def done(position: int, result: CampaignResult) -> None:
        results[position] = result
        if progress is not None:
            finished = [found for found in results if found is not None]
            failing = sum(found.counterexample is not None for found in finished)
            rate = sum(found.examples for found in finished) / max(time.perf_counter() - started, 1e-9)
            progress(f"{name}: {len(finished)}/{len(results)} shards, {rate:,.0f} programs/s, {failing} failing")

    pool.run(run_shard, shards, done)
    return merge(shards, [result for result in results if result is not None], time.perf_counter() - started)
