"""The tiered cache (`kvsched.spec.tiers`): its events as the machine draws them and the explorer
enumerates them, its own step checks, and its registration.

Sequences are prefixes of a few chains that share their first keys, so lookups hit on either
tier, evictions and demotions compete, and two requests can hold the same content. A commit is
given what a lookup answered now, what one answered some steps ago (the machine remembers every
answer it computed: the two phases with other events between them), or nothing. Copies complete
or fail in any order, late (after their request was freed) or early; leases begin and end
around everything else.

The step checks read what the calls read: every page a request's forward pass reads holds its
key's content, and a lease reads what it saw when it began (`FailureKind.GHOST`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

from kvsched.spec import tier_events as tev
from kvsched.spec.tiers import TIER_INVARIANTS, Match, TieredCache, TierState, holding, lookup
from kvsched.testing.component import QUERY, Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY

CHAINS = (("a", "b", "c"), ("a", "b", "d"), ("x", "y"))


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One tiered cache's sizes and what the harnesses draw from."""

    device_pages: int = 5
    host_pages: int = 3
    chains: tuple[tuple[str, ...], ...] = CHAINS
    requests: int = 3  # request ids 0 .. requests - 1 (and one out of range)

    def sequences(self) -> tuple[tuple[str, ...], ...]:
        """Every non-empty prefix of every chain."""
        return tuple(dict.fromkeys(chain[:n] for chain in self.chains for n in range(1, len(chain) + 1)))


def spec_tiers(config: TierConfig) -> TieredCache:
    """The spec's tiered cache."""
    return TieredCache(config.device_pages, config.host_pages)


def impl_tiers(config: TierConfig) -> Any:
    """impl's tiered cache."""
    from kvsched.impl.tiers import TieredCache as ImplTieredCache

    return ImplTieredCache(config.device_pages, config.host_pages)


# -- the machine's draws ---------------------------------------------------------------------------


@cache
def _keys(config: TierConfig) -> st.SearchStrategy[Any]:
    bad = st.sampled_from([(), ("a", "a"), ["a"], (None,), "a"])
    return st.one_of(st.sampled_from(config.sequences()), bad)


@cache
def _request(config: TierConfig) -> st.SearchStrategy[int]:
    return st.integers(-1, config.requests)


def draw_lookup(machine: Any) -> st.SearchStrategy[tev.LookupKeys]:
    return st.builds(tev.LookupKeys, _keys(machine.config))


def _answers(machine: Any) -> list[tuple[tuple[str, ...], Match]]:
    """Every lookup answer the machine computed in this program, the current ones added now."""
    remembered: list[tuple[tuple[str, ...], Match]] = machine.__dict__.setdefault("tier_answers", [])
    state = machine.state()
    for keys in machine.config.sequences():
        answer = (keys, lookup(state, keys))
        if answer[1] != Match() and answer not in remembered:
            remembered.append(answer)
    return remembered


def draw_commit(machine: Any) -> st.SearchStrategy[tev.Commit]:
    config = machine.config
    answers = _answers(machine)
    fresh = st.builds(tev.Commit, _request(config), st.sampled_from(config.sequences()))
    bad = st.builds(
        tev.Commit, _request(config), _keys(config), st.sampled_from([Match(), "match", Match((("zz", 0),))])
    )
    if not answers:
        return st.one_of(fresh, bad)
    found = st.sampled_from(answers).flatmap(
        lambda answer: st.builds(tev.Commit, _request(config), st.just(answer[0]), st.just(answer[1]))
    )
    return st.one_of(found, found, fresh, bad)


def draw_compute(machine: Any) -> st.SearchStrategy[tev.Compute]:
    return st.builds(tev.Compute, _request(machine.config))


def draw_free(machine: Any) -> st.SearchStrategy[tev.FreeRequest]:
    return st.builds(tev.FreeRequest, _request(machine.config))


def draw_demote(machine: Any) -> st.SearchStrategy[tev.Demote]:
    return st.builds(tev.Demote, st.integers(-1, 3))


def draw_complete(machine: Any) -> st.SearchStrategy[tev.Complete]:
    ids = [t.transfer_id for t in machine.state().transfers]
    which = st.one_of(st.sampled_from(ids), st.integers(-1, 4)) if ids else st.integers(-1, 4)
    return st.builds(tev.Complete, which, st.sampled_from([True, True, False, 1]))


def draw_lease(machine: Any) -> st.SearchStrategy[tev.TakeLease]:
    return st.builds(tev.TakeLease, st.integers(-1, machine.config.device_pages))


def draw_end_lease(machine: Any) -> st.SearchStrategy[tev.EndLease]:
    ids = [lease.lease_id for lease in machine.state().leases]
    return st.builds(tev.EndLease, st.one_of(st.sampled_from(ids), st.integers(-1, 4)) if ids else st.integers(-1, 4))


# -- the explorer's ranges -------------------------------------------------------------------------


def explore_lookup(state: TierState, config: TierConfig) -> Iterator[tev.LookupKeys]:
    yield from (tev.LookupKeys(keys) for keys in config.sequences())


def explore_commit(state: TierState, config: TierConfig) -> Iterator[tev.Commit]:
    """Each free request id with each sequence: with the lookup's answer now, with nothing, and with
    answers a lookup gave in another state (its first key on any one device or host page)."""
    for rid in range(config.requests):
        if holding(state, rid) is not None:
            continue
        for keys in config.sequences():
            yield tev.Commit(rid, keys, lookup(state, keys))
            yield tev.Commit(rid, keys, None)
            yield from (tev.Commit(rid, keys, Match(((keys[0], page),))) for page in range(config.device_pages))
            yield from (tev.Commit(rid, keys, Match((), ((keys[0], page),))) for page in range(config.host_pages))
    yield tev.Commit(0, (), None)


def explore_compute(state: TierState, config: TierConfig) -> Iterator[tev.Compute]:
    yield from (tev.Compute(rid) for rid in range(-1, config.requests + 1))


def explore_free(state: TierState, config: TierConfig) -> Iterator[tev.FreeRequest]:
    yield from (tev.FreeRequest(rid) for rid in range(-1, config.requests + 1))


def explore_demote(state: TierState, config: TierConfig) -> Iterator[tev.Demote]:
    yield from (tev.Demote(n) for n in (-1, 1, 2))


def explore_complete(state: TierState, config: TierConfig) -> Iterator[tev.Complete]:
    for transfer in state.transfers:
        yield tev.Complete(transfer.transfer_id, True)
        yield tev.Complete(transfer.transfer_id, False)
    yield tev.Complete(len(state.transfers) + len(state.leases), True)


def explore_lease(state: TierState, config: TierConfig) -> Iterator[tev.TakeLease]:
    """Every page, but one lease at a time (so the state space is finite)."""
    if not state.leases:
        yield from (tev.TakeLease(page) for page in range(-1, config.device_pages + 1))


def explore_end_lease(state: TierState, config: TierConfig) -> Iterator[tev.EndLease]:
    yield from (tev.EndLease(lease.lease_id) for lease in state.leases)
    yield tev.EndLease(-1)


# -- its own step checks -----------------------------------------------------------------------------


def reads_own_keys(step: StepContext) -> CheckFailure | None:
    """Every page a request's forward pass read held that position's key's content."""
    if not isinstance(step.event, tev.Compute) or step.outcome.error is not None:
        return None
    held = holding(step.before, step.event.request_id)
    for position, content in step.outcome.value:
        expected = held.keys[position] if held is not None and 0 <= position < len(held.keys) else None
        if content != expected:
            return CheckFailure(
                FailureKind.GHOST,
                f"{step.event!r} read {content!r} at position {position}, which holds {expected!r}",
            )
    return None


def lease_reads_what_it_saw(step: StepContext) -> CheckFailure | None:
    """A lease's reader reads, when it ends, the content its page held when it began."""
    if not isinstance(step.event, tev.EndLease) or step.outcome.error is not None:
        return None
    held = next((lease for lease in step.before.leases if lease.lease_id == step.event.lease_id), None)
    seen = None if held is None else held.content
    if step.outcome.value != seen:
        return CheckFailure(
            FailureKind.GHOST, f"{step.event!r} read {step.outcome.value!r}; its lease began on {seen!r}"
        )
    return None


def drain(state: TierState) -> list[Any]:
    """Every copy completes, every lease ends, every request is freed."""
    return [
        *(tev.Complete(t.transfer_id, True) for t in state.transfers),
        *(tev.EndLease(lease.lease_id) for lease in state.leases),
        *(tev.FreeRequest(held.request_id) for held in state.requests),
    ]


def drained(state: TierState) -> bool:
    """Nothing holds a page but the caches: every other page is free on both tiers."""
    return all(
        len(tier.free) + len(tier.cache) == len(tier.refs) and all(tier.refs[e.page] == 1 for e in tier.cache)
        for tier in (state.device, state.host)
    )


# -- the registration ----------------------------------------------------------------------------

TIERS = Component(
    name="tiers",
    summary="the tiered cache: device and host pages, copies in flight, leases, admission in two phases",
    state=TierState,
    events=(
        EventSpec(tev.LookupKeys, read_only=True, gaps={Z: QUERY}, draw=draw_lookup, explore=explore_lookup),
        EventSpec(
            tev.Commit,
            z3=("tier_safety:attach", "tier_safety:evict", "tier_safety:take", "tier_safety:promote"),
            ids=("request_id",),
            draw=draw_commit,
            explore=explore_commit,
        ),
        EventSpec(
            tev.Compute, z3=("tier_safety:cache",), ids=("request_id",), draw=draw_compute, explore=explore_compute
        ),
        EventSpec(
            tev.FreeRequest, z3=("tier_safety:release",), ids=("request_id",), draw=draw_free, explore=explore_free
        ),
        EventSpec(
            tev.Demote, z3=("tier_safety:host_evict", "tier_safety:demote"), draw=draw_demote, explore=explore_demote
        ),
        EventSpec(
            tev.Complete,
            z3=(
                "tier_safety:demoted",
                "tier_safety:demote_failed",
                "tier_safety:promoted",
                "tier_safety:promote_failed",
            ),
            draw=draw_complete,
            explore=explore_complete,
        ),
        EventSpec(tev.TakeLease, z3=("tier_safety:lease",), ids=("page",), draw=draw_lease, explore=explore_lease),
        EventSpec(tev.EndLease, z3=("tier_safety:end_lease",), draw=draw_end_lease, explore=explore_end_lease),
    ),
    invariants=TIER_INVARIANTS,
    abstraction=lambda tiers: tiers.to_spec(),
    spec=spec_tiers,
    impl=impl_tiers,
    checks=(reads_own_keys, lease_reads_what_it_saw),
    explored={
        "ci": (TierConfig(device_pages=2, host_pages=1, chains=(("a", "b"),), requests=2),),
        "deep": (TierConfig(device_pages=2, host_pages=1, chains=(("a", "b"), ("c",)), requests=2),),
    },
    drain=drain,
    drained=drained,
    corpora=(
        Corpus("tiers", "kvsched.testing.tier_variants:VARIANTS"),
        Corpus("tiers_encoding", "kvsched.proofs.tier_safety:broken"),
    ),
    gaps={
        C: "the tiered cache has no CrossHair contracts: its machine, explorer and z3 proof check it",
        S: "safety mode drives a foreign manager's tiers through the adapter's optional verbs",
    },
)
