"""The engine explorer: every reachable state of a small engine (five candidate requests, a pool
of four pages, two priorities, a state slot each, one prefix entry) is explored with every check
and liveness from every state; so is every state of a small engine with the automatic prefix
cache (three requests sharing pages, two tenants; ghost KV), and of that engine with a host tier
of two pages (copies completed, left in flight or failed at every step, or failing to start;
liveness also with every copy failing and with one bad host page); impl in lockstep with the
spec on a bounded part of each; and the broken engines each can see are caught by the named
check (the adapters' on the cached engine with one request under another adapter)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched.proofs.engine_explorer import (
    ADAPTERS,
    CACHED,
    HOSTED,
    SMALL,
    WHOLE,
    WHOLE_CACHED,
    EngineBounds,
    EngineExplorer,
)
from kvsched.testing.checks import FailureKind
from kvsched.testing.engine_machine import impl_engine, spec_engine
from kvsched.testing.engine_variants import ENGINE_VARIANTS

CACHED_CHUNKED = replace(CACHED, config=replace(CACHED.config, chunk_size=1))

# What the explorer reports for each variant it can see: with the spec beside it, and alone.
CAUGHT = {
    "preempt_to_back": (FailureKind.LOCKSTEP, FailureKind.ORDER),
    "admit_too_large": (FailureKind.LOCKSTEP, FailureKind.LIVENESS),
    "never_preempt": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "full_hit_prefills_nothing": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "skip_memory_guard": (FailureKind.LOCKSTEP, None),
    "state_slot_released_twice": (FailureKind.LOCKSTEP, FailureKind.INVARIANT),
}
# The host tier's broken engines on the hosted configuration.
CAUGHT_HOSTED = {
    "failed_promotion_served": (FailureKind.LOCKSTEP, FailureKind.CACHE),
    # alone, GHOST lies 3,849 states deep (30 s): its pinned program is that path (tests/engine/golden/)
    "copies_issued_in_two_calls": (FailureKind.LOCKSTEP, None),
    "failed_demotion_retried": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "failed_host_page_first": (FailureKind.LOCKSTEP, None),
}
# The same on the cached configuration, for the prefix cache's broken engines.
CAUGHT_CACHED = {
    "evict_keeps_key": (FailureKind.LIVENESS, FailureKind.LIVENESS),
    "cache_holds_no_reference": (FailureKind.LOCKSTEP, FailureKind.INVARIANT),
    "salt_dropped": (FailureKind.LOCKSTEP, FailureKind.ISOLATION),
}
# On the cached configuration's requests, one of them under another LoRA adapter.
CAUGHT_ADAPTERS = {
    "adapter_dropped": (FailureKind.LOCKSTEP, FailureKind.ISOLATION),
}


@pytest.mark.proof
@pytest.mark.parametrize(
    ("bounds", "states", "reached"),
    [
        (SMALL, 5_000, ("preemptions", "refusals")),
        (CACHED, 3_000, ("cache_hits", "preemptions")),
        (WHOLE, 3_000, ("refusals",)),  # whole-prompt admission: no preemption is reachable here
        (WHOLE_CACHED, 1_000, ("cache_hits", "refusals")),
    ],
    ids=["small", "cached", "whole", "whole-cached"],
)
def test_every_reachable_state_of_the_spec_engine_passes_every_check(
    bounds: EngineBounds, states: int, reached: tuple[str, ...]
) -> None:
    result = EngineExplorer(bounds, spec_engine).run()
    assert result.violation is None, (result.violation, result.path)
    assert result.complete and result.states > states
    assert all(getattr(result, counter) > 0 for counter in reached)  # pressure, refusals, hits were reached


def test_the_hosted_engine_passes_every_check_on_its_first_states() -> None:
    """Its first 4,000 states, breadth first, with copies back from the host and failed ones
    among them; the whole space is explored by `python -m kvsched.proofs.engine_explorer` (make
    deep)."""
    result = EngineExplorer(replace(HOSTED, max_states=4_000), spec_engine).run()
    assert result.violation is None, (result.violation, result.path)
    assert result.states >= 4_000 and result.host_hits > 0 and result.preemptions > 0


@pytest.mark.parametrize(
    ("bounds", "first", "states", "reached"),
    [
        (SMALL, 1_500, 700, "preemptions"),
        (CACHED, 1_000, 450, "cache_hits"),
        (WHOLE, 1_500, 700, "refusals"),
        (WHOLE_CACHED, 1_000, 450, "cache_hits"),
        (HOSTED, 1_000, 450, "preemptions"),  # its host hits lie deeper: the machine's host shapes hold them
    ],
    ids=["small", "cached", "whole", "whole-cached", "hosted"],
)
def test_impl_engine_in_lockstep_on_the_first_states(
    bounds: EngineBounds, first: int, states: int, reached: str
) -> None:
    result = EngineExplorer(replace(bounds, max_states=first), impl_engine, spec_engine).run()
    assert result.violation is None, (result.violation, result.path)
    assert result.states >= states and getattr(result, reached) > 0


@pytest.mark.parametrize(
    ("name", "bounds", "caught"),
    [(name, SMALL, CAUGHT[name]) for name in sorted(CAUGHT)]
    + [(name, CACHED, CAUGHT_CACHED[name]) for name in sorted(CAUGHT_CACHED)]
    # Caching a page when it is allocated shows once a chunk leaves a page part-written.
    + [("publish_on_allocation", CACHED_CHUNKED, (FailureKind.LOCKSTEP, FailureKind.CACHE))]
    # The host tier's: a failed copy back taken as done.
    + [(name, HOSTED, CAUGHT_HOSTED[name]) for name in sorted(CAUGHT_HOSTED)]
    + [(name, ADAPTERS, CAUGHT_ADAPTERS[name]) for name in sorted(CAUGHT_ADAPTERS)],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_the_explorer_catches_a_broken_engine(
    name: str, bounds: EngineBounds, caught: tuple[FailureKind, FailureKind | None]
) -> None:
    variant = next(variant for variant in ENGINE_VARIANTS if variant.name == name)
    with_reference, alone = caught
    found = EngineExplorer(bounds, variant.factory(), spec_engine).run().violation
    assert found is not None and found.kind is with_reference
    if alone is not None:  # None: only the spec can tell
        found = EngineExplorer(bounds, variant.factory()).run().violation
        assert found is not None and found.kind is alone
