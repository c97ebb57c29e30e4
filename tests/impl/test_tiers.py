"""impl's tiered cache in lockstep with the spec's (`kvsched.spec.tiers`), by its registration, and
every broken tiered cache (`kvsched.testing.tier_variants`) caught by a named check.

Each upstream bug has a pinned program and a test named after it: the program runs on the broken
cache alone (no reference beside it), every step checked, and the check that must catch it does.
The checks that read what a call read (a request's forward pass, a lease's reader) are shown
catching the bugs whose reads go wrong once the invariants are not there to catch them first.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest

from kvsched.impl.tiers import TieredCache as ImplTieredCache
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec import tier_events as tev
from kvsched.spec.errors import CopyPending, Exhausted, NotWritten, UnknownLease, UnknownTransfer
from kvsched.spec.step import apply
from kvsched.spec.tiers import Match, TieredCache
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import check_step
from kvsched.testing.component_machine import machine_for
from kvsched.testing.components.tiers import TierConfig, impl_tiers, spec_tiers
from kvsched.testing.outcome import CheckFailed, CheckFailure, FailureKind, capture
from kvsched.testing.registry import TIERS
from kvsched.testing.tier_variants import VARIANTS

CALLS: Counter[str] = Counter()
EXPLORED = TIERS.explored["ci"][0]


def run(cache: Any, program: list[Any], reference: Any = None, invariants: bool = True) -> CheckFailure | None:
    """Each event on `cache` (and `reference`), every step checked; the first failure."""
    for event in program:
        before = cache.to_spec()
        outcome = capture(functools.partial(apply, cache, event))
        expected = None
        if reference is not None:
            expected = capture(functools.partial(apply, reference, event)), reference.to_spec()
        failure = check_step(before, event, outcome, cache.to_spec(), expected, component=TIERS, invariants=invariants)
        if failure is not None:
            return failure
    return None


def host_holds_a() -> list[Any]:
    """`a` computed, freed, demoted to host page 0, and evicted from the device by x, y, z."""
    return [
        tev.Commit(0, ("a",)),
        tev.Compute(0),
        tev.FreeRequest(0),
        tev.Demote(1),
        tev.Complete(0),
        tev.Commit(1, ("x", "y", "z")),
        tev.Compute(1),
        tev.FreeRequest(1),
    ]


A_ON_HOST = Match((), (("a", 0),))
B_REPLACES_A_ON_HOST = [
    tev.Commit(1, ("b",)),
    tev.Compute(1),
    tev.FreeRequest(1),
    tev.Demote(1),
    tev.Complete(0),
]
PROGRAMS: dict[str, tuple[list[Any], FailureKind]] = {
    "sglang_24527_abort_frees_pages_under_a_copy": (
        [*host_holds_a(), tev.Commit(2, ("a",), A_ON_HOST), tev.FreeRequest(2)],
        FailureKind.INVARIANT,
    ),
    "dingocache_76_preemption_frees_pages_a_lease_reads": (
        [tev.Commit(0, ("a",)), tev.Compute(0), tev.TakeLease(0), tev.FreeRequest(0)],
        FailureKind.INVARIANT,
    ),
    "sglang_38480_host_page_reclaimed_mid_copy": (
        [*host_holds_a(), tev.Commit(2, ("a",), A_ON_HOST), tev.Demote(1)],
        FailureKind.INVARIANT,
    ),
    "vllm_37076_commit_trusts_the_device_match": (
        [
            tev.Commit(0, ("a",)),
            tev.Compute(0),
            tev.FreeRequest(0),
            tev.Commit(1, ("x", "y", "z")),
            tev.Compute(1),
            tev.FreeRequest(1),
            tev.Commit(2, ("a",), Match((("a", 0),))),
            tev.Compute(2),
        ],
        FailureKind.INVARIANT,
    ),
    "vllm_39702_commit_trusts_the_host_match": (
        [*host_holds_a(), *B_REPLACES_A_ON_HOST, tev.Commit(2, ("a",), A_ON_HOST), tev.Complete(0), tev.Compute(2)],
        FailureKind.INVARIANT,
    ),
    "vllm_53498_host_hashes_never_registered": (host_holds_a(), FailureKind.LOCKSTEP),
    "trtllm_8813_reused_host_page_keeps_its_key": (
        [*host_holds_a(), *B_REPLACES_A_ON_HOST, tev.Commit(2, ("a",), A_ON_HOST), tev.Complete(0), tev.Compute(2)],
        FailureKind.INVARIANT,
    ),
    "vllm_42571_same_block_twice_in_one_free": (
        [tev.Commit(0, ("a",)), tev.Compute(0), tev.Demote(1), tev.FreeRequest(0)],
        FailureKind.INVARIANT,
    ),
    "sglang_33970_copy_reads_an_unwritten_page": (
        [tev.Commit(0, ("a",)), tev.TakeLease(0), tev.Compute(0), tev.EndLease(0)],
        FailureKind.INVARIANT,
    ),
}
READ_WRONG = {  # with the invariants off, the reads themselves go wrong: the ghost checks see it
    "vllm_37076_commit_trusts_the_device_match",
    "vllm_39702_commit_trusts_the_host_match",
    "trtllm_8813_reused_host_page_keeps_its_key",
    "sglang_33970_copy_reads_an_unwritten_page",
}


def test_impl_refines_the_spec() -> None:
    CALLS.clear()
    machine = machine_for(TIERS, impl_tiers, spec_tiers, TierConfig(), tally=CALLS)
    machine.TestCase.settings = bounded(150, 40)  # make test's time: the explorer below is exhaustive
    machine.TestCase().runTest()
    assert CALLS["made"] > 1000 and CALLS["refused"] > 0  # good input and bad reached both


@pytest.mark.proof
def test_every_state_of_a_small_tiered_cache_refines_the_spec() -> None:
    result = ComponentExplorer(TIERS, EXPLORED, impl_tiers, spec_tiers).run()
    assert result.complete and result.violation is None, result.violation
    assert result.states == 2048 and result.transitions == 54_526


def test_every_program_is_clean_on_the_spec_and_impl() -> None:
    """The pinned programs are fair: the correct caches pass every one of them."""
    for program, _ in PROGRAMS.values():
        assert run(ImplTieredCache(3, 1), program, TieredCache(3, 1)) is None


NAMED = {  # the invariant that catches each bug first
    "sglang_24527_abort_frees_pages_under_a_copy": "counts_are_holders",
    "dingocache_76_preemption_frees_pages_a_lease_reads": "counts_are_holders",
    "sglang_38480_host_page_reclaimed_mid_copy": "counts_are_holders",
    "vllm_37076_commit_trusts_the_device_match": "requests_hold_their_keys",
    "vllm_39702_commit_trusts_the_host_match": "cached_pages_hold_their_keys, requests_hold_their_keys",
    "trtllm_8813_reused_host_page_keeps_its_key": "cached_pages_hold_their_keys, requests_hold_their_keys",
    "vllm_42571_same_block_twice_in_one_free": "counts_are_holders",
    "sglang_33970_copy_reads_an_unwritten_page": "leases_hold_written_pages",
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_upstream_bug_is_caught_by_its_check(name: str) -> None:
    program, kind = PROGRAMS[name]
    reference = TieredCache(3, 1) if kind is FailureKind.LOCKSTEP else None
    failure = run(VARIANTS[name](3, 1), program, reference)
    assert failure is not None and failure.kind is kind, failure
    assert kind is FailureKind.LOCKSTEP or failure.detail == NAMED[name], failure


@pytest.mark.parametrize("name", sorted(READ_WRONG))
def test_the_read_checks_catch_what_the_invariants_would(name: str) -> None:
    program, _ = PROGRAMS[name]
    failure = run(VARIANTS[name](3, 1), program, invariants=False)
    assert failure is not None and failure.kind is FailureKind.GHOST, failure


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_broken_cache_is_told_apart_by_the_explorer(name: str) -> None:
    config = TierConfig(device_pages=2, host_pages=1, chains=(("a", "b"), ("c",)), requests=2)
    violation = (
        ComponentExplorer(TIERS, config, lambda c: VARIANTS[name](c.device_pages, c.host_pages), spec_tiers)
        .run(20_000)
        .violation
    )
    assert violation is not None, name


def test_the_machine_finds_a_broken_cache() -> None:
    machine = machine_for(
        TIERS, lambda c: VARIANTS["vllm_37076_commit_trusts_the_device_match"](5, 3), spec_tiers, TierConfig()
    )
    machine.TestCase.settings = bounded(2000, 40, shrink=False)
    with pytest.raises(CheckFailed):
        machine.TestCase().runTest()


def test_the_transitions_by_hand() -> None:
    """Two-phase admission, a late copy, a lease across a free, every refusal typed."""
    cache = TieredCache(3, 1)
    cache.commit(0, ("a", "b"))
    assert cache.compute(0) == ()  # nothing to read yet: both pages written now
    assert cache.compute(0) == ((0, "a"), (1, "b"))
    lease = cache.lease(0)
    cache.free(0)  # the reader still holds page 0
    assert cache.state.device.refs[0] == 2  # the cache and the lease
    assert cache.demote(5) == (1,)  # one host page: the least recently used key (a) goes; id 0 is the lease's
    stale = cache.lookup(("a",))
    cache.commit(1, ("x", "y"))  # evicts b: a is leased and being copied
    assert cache.lookup(("b",)) == Match()
    with pytest.raises(Exhausted):
        cache.commit(2, ("z",))
    assert cache.end_lease(lease) == "a"
    cache.complete(1)
    cache.free(1)
    admitted = cache.commit(2, ("a", "q"), stale)  # a still cached: the lookup holds
    assert (admitted.device_hits, admitted.host_hits) == (1, 0)
    with pytest.raises(UnknownLease):
        cache.end_lease(lease)
    with pytest.raises(UnknownTransfer):
        cache.complete(1)
    with pytest.raises(NotWritten):
        cache.lease(cache.state.requests[0].pages[1])
    cache.free(2)
    cache.commit(3, ("x", "y", "z"))  # a leaves the device; the host has it
    cache.compute(3)
    cache.free(3)
    found = cache.lookup(("a", "q"))
    assert found.device == () and [key for key, _ in found.host] == ["a"]
    admitted = cache.commit(4, ("a", "q"), found)
    assert admitted.host_hits == 1
    with pytest.raises(CopyPending):
        cache.compute(4)
    cache.free(4)  # cancelled with its copy in flight
    cache.complete(admitted.transfers[0])  # the late copy lands in a page only it held
    assert cache.lookup(("a",)).device  # and its content is a's: it is cached
