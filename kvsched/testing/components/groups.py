"""The KV groups (`kvsched.spec.kv_groups`): their events as the machine draws them and the
explorer enumerates them, their own step check, and their registration.

Prompts share their first tokens, so prefixes hit in some groups and not others, windows slide
past pages the cache still holds, snapshots compete with running states for slots, and drafts are
accepted in part, whole or not at all, on the last known token or not.

The step check reads what a pass read: every position a query read (and every state it resumed)
holds the KV of the request's own tokens through that position (`FailureKind.GHOST`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from hypothesis import strategies as st

from kvsched.spec import group_events as gev
from kvsched.spec.kv_groups import (
    GROUP_INVARIANTS,
    NULL,
    Chunked,
    Full,
    GroupState,
    KvGroups,
    Layout,
    Recurrent,
    Window,
    holding,
)
from kvsched.testing.component import QUERY, Component, Corpus, EventSpec, Harness, StepContext
from kvsched.testing.outcome import CheckFailure, FailureKind

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY

HYBRID = Layout(
    (Full(), Window(4), Recurrent()),
    page_size=2,
    pages=10,
    state_slots=3,
    draft_tokens=2,
    step_tokens=4,
    max_tokens=10,
)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A layout and what the harnesses draw from: prompts, request ids, token values."""

    layout: Layout = HYBRID
    prompts: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4, 5), (1, 2, 3, 4, 6, 7), (1, 2, 8), (9,))
    requests: int = 3  # request ids 0 .. requests - 1 (and one out of range)
    tokens: tuple[int, ...] = (1, 2, 7)  # what drafts and samples draw


def spec_groups(config: GroupConfig) -> KvGroups:
    """The spec's KV groups."""
    return KvGroups(config.layout)


def impl_groups(config: GroupConfig) -> Any:
    """impl's KV groups."""
    from kvsched.impl.kv_groups import KvGroups as ImplKvGroups

    return ImplKvGroups(config.layout)


# -- the machine's draws ---------------------------------------------------------------------------


@cache
def _prompt(config: GroupConfig) -> st.SearchStrategy[Any]:
    bad = st.sampled_from([(), (1, -2), [1, 2], (1, 2**32), "ab", (1,) * (config.layout.max_tokens + 1)])
    return st.one_of(st.sampled_from(config.prompts), st.sampled_from(config.prompts), bad)


@cache
def _request(config: GroupConfig) -> st.SearchStrategy[int]:
    return st.integers(-1, config.requests)


def _held(machine: Any) -> st.SearchStrategy[int]:
    ids = [held.request_id for held in machine.state().requests]
    any_id = _request(machine.config)
    return st.one_of(st.sampled_from(ids), st.sampled_from(ids), any_id) if ids else any_id


def draw_lookup(machine: Any) -> st.SearchStrategy[gev.LookupTokens]:
    return st.builds(gev.LookupTokens, _prompt(machine.config))


def draw_admit(machine: Any) -> st.SearchStrategy[gev.AdmitTokens]:
    return st.builds(gev.AdmitTokens, _request(machine.config), _prompt(machine.config))


def draw_compute(machine: Any) -> st.SearchStrategy[gev.ForwardPass]:
    """Any count and drafts; often a request's whole rest (with drafts after it, or not), or all
    of it but the tokens a draft pass then fits in (so drafts come after a pass that fits)."""
    config = machine.config
    layout = config.layout
    fitting = st.lists(st.sampled_from(config.tokens), min_size=1, max_size=max(layout.draft_tokens, 1)).map(tuple)
    drafts = st.one_of(
        st.just(()),
        fitting,
        st.lists(st.sampled_from(config.tokens), min_size=1, max_size=layout.draft_tokens + 1).map(tuple),
        st.sampled_from([(-1,), [1]]),
    )
    anything = st.builds(gev.ForwardPass, _held(machine), st.integers(0, layout.step_tokens + 1), drafts)
    rests = [(h.request_id, len(h.tokens) - h.computed) for h in machine.state().requests if not h.drafts]
    if not rests:
        return anything
    rest = st.sampled_from(rests).flatmap(lambda r: st.builds(gev.ForwardPass, st.just(r[0]), st.just(r[1]), drafts))
    room = layout.step_tokens - layout.draft_tokens  # what a pass before its drafts may compute
    setup = [(rid, left - room) for rid, left in rests if left > room]
    if not setup:
        return st.one_of(rest, rest, anything)
    near = st.sampled_from(setup).flatmap(lambda r: st.builds(gev.ForwardPass, st.just(r[0]), st.just(r[1])))
    return st.one_of(rest, rest, near, anything)


def draw_accept(machine: Any) -> st.SearchStrategy[gev.AcceptDrafts]:
    """Any count and token; often a count of a request's own drafts, or a sample after a request's
    last known token (so its next pass runs past it)."""
    config = machine.config
    token = st.one_of(st.sampled_from(config.tokens), st.sampled_from([-1, "t"]))
    anything = st.builds(gev.AcceptDrafts, _held(machine), st.integers(-1, config.layout.draft_tokens + 1), token)
    requests = machine.state().requests
    drafting = [(h.request_id, len(h.drafts)) for h in requests if h.drafts]
    sampling = [(h.request_id, 0) for h in requests if not h.drafts and h.computed == len(h.tokens)]
    if not drafting + sampling:
        return anything
    kept = st.sampled_from(drafting + sampling).flatmap(
        lambda d: st.builds(gev.AcceptDrafts, st.just(d[0]), st.integers(0, d[1]), st.sampled_from(config.tokens))
    )
    return st.one_of(kept, kept, anything)


def draw_free(machine: Any) -> st.SearchStrategy[gev.Leave]:
    return st.builds(gev.Leave, _held(machine))


# -- the explorer's ranges -------------------------------------------------------------------------


def explore_lookup(state: GroupState, config: GroupConfig) -> Iterator[gev.LookupTokens]:
    yield from (gev.LookupTokens(prompt) for prompt in config.prompts)


def explore_admit(state: GroupState, config: GroupConfig) -> Iterator[gev.AdmitTokens]:
    for rid in range(config.requests):
        if holding(state, rid) is None:
            yield from (gev.AdmitTokens(rid, prompt) for prompt in config.prompts)
    yield gev.AdmitTokens(0, ())


def explore_compute(state: GroupState, config: GroupConfig) -> Iterator[gev.ForwardPass]:
    """Each request's every count; on its last known token, with each draft of one token too."""
    layout = config.layout
    for held in state.requests:
        left = len(held.tokens) - held.computed
        for count in range(1, min(left, layout.step_tokens) + 1):
            yield gev.ForwardPass(held.request_id, count)
            if count == left and layout.draft_tokens:
                yield from (gev.ForwardPass(held.request_id, count, (token,)) for token in config.tokens)
    yield gev.ForwardPass(config.requests, 1)


def explore_accept(state: GroupState, config: GroupConfig) -> Iterator[gev.AcceptDrafts]:
    """Each request with drafts, every count of them kept; each at its last token, a sample."""
    for held in state.requests:
        if held.drafts or held.computed == len(held.tokens):
            for kept in range(len(held.drafts) + 1):
                yield from (gev.AcceptDrafts(held.request_id, kept, token) for token in config.tokens)
    yield gev.AcceptDrafts(config.requests, 0, config.tokens[0])


def explore_free(state: GroupState, config: GroupConfig) -> Iterator[gev.Leave]:
    yield from (gev.Leave(held.request_id) for held in state.requests)
    yield gev.Leave(config.requests)


# -- its own step check ------------------------------------------------------------------------------


def reads_own_tokens(step: StepContext) -> CheckFailure | None:
    """Every position a pass read, and every state it resumed, held the KV of the request's own
    tokens through that position."""
    if not isinstance(step.event, gev.ForwardPass) or step.outcome.error is not None:
        return None
    held = holding(step.before, step.event.request_id)
    tokens = () if held is None else held.tokens
    for read in step.outcome.value:
        if read.holds != tokens[: read.position + 1]:
            return CheckFailure(
                FailureKind.GHOST,
                f"{step.event!r} read group {read.group} at position {read.position} holding the KV of "
                f"{read.holds!r}, not of {tokens[: read.position + 1]!r}",
            )
    return None


def drain(state: GroupState) -> list[Any]:
    """Every request is freed."""
    return [gev.Leave(held.request_id) for held in state.requests]


def drained(state: GroupState) -> bool:
    """Nothing holds a page but the cache, nor a slot but the snapshots."""
    return (
        len(state.free) + len(state.cache) == len(state.refs) - 1
        and all(state.refs[entry.page] == 1 for entry in state.cache)
        and state.refs[NULL] == 0
        and len(state.free_slots) + len(state.snapshots) == len(state.slots)
    )


# -- the registration ----------------------------------------------------------------------------

SMALL = GroupConfig(  # a full group and a window of two over five pages (room for a window's release), one
    # request at a time (its cached pages serve the next), prompts sharing a token, one draft
    Layout((Full(), Window(2)), page_size=1, pages=6, draft_tokens=1, step_tokens=2, max_tokens=3),
    prompts=((1, 2), (1, 3)),
    requests=1,
    tokens=(2,),
)
SMALL_RECURRENT = GroupConfig(  # a full group and a recurrent one: its state and snapshots in two slots
    Layout((Full(), Recurrent()), page_size=1, pages=4, state_slots=2, draft_tokens=1, step_tokens=2, max_tokens=3),
    prompts=((1, 2), (1, 3)),
    requests=1,
    tokens=(2,),
)
SMALL_CHUNKED = GroupConfig(  # chunks of two and a recurrent group
    Layout((Chunked(2), Recurrent()), page_size=1, pages=4, state_slots=2, draft_tokens=1, step_tokens=2, max_tokens=3),
    prompts=((1, 2), (1, 3)),
    requests=1,
    tokens=(2,),
)
# The machine's other layout: HYBRID's with chunks of four in place of the window.
CHUNKED = GroupConfig(replace(HYBRID, groups=(Full(), Chunked(4), Recurrent()), pages=9))
DEEP = (
    GroupConfig(  # SMALL with two token values to draft and sample
        Layout((Full(), Window(2)), page_size=1, pages=5, draft_tokens=1, step_tokens=2, max_tokens=3),
        prompts=((1, 2), (1, 3)),
        requests=2,
        tokens=(2, 3),
    ),
    GroupConfig(  # a window of one position: every page behind it released at once
        Layout((Full(), Window(1)), page_size=1, pages=5, draft_tokens=1, step_tokens=2, max_tokens=3),
        prompts=((1, 2), (1, 3)),
        requests=2,
        tokens=(2, 3),
    ),
    GroupConfig(  # a window and a recurrent group: state, snapshots and window pages compete
        Layout(
            (Window(2), Recurrent()), page_size=1, pages=4, state_slots=3, draft_tokens=1, step_tokens=2, max_tokens=3
        ),
        prompts=((1, 2), (1, 3)),
        requests=1,
        tokens=(2,),
    ),
)

GROUPS = Component(
    name="groups",
    summary="KV of more than one kind: full, window and chunked attention over one pool, recurrent state, drafts",
    state=GroupState,
    events=(
        EventSpec(gev.LookupTokens, read_only=True, gaps={Z: QUERY}, draw=draw_lookup, explore=explore_lookup),
        EventSpec(
            gev.AdmitTokens,
            z3=("group_safety:attach",),
            ids=("request_id",),
            draw=draw_admit,
            explore=explore_admit,
        ),
        EventSpec(
            gev.ForwardPass,
            z3=("group_safety:take", "group_safety:evict", "group_safety:cache", "group_safety:release"),
            ids=("request_id",),
            draw=draw_compute,
            explore=explore_compute,
        ),
        EventSpec(
            gev.AcceptDrafts,
            z3=("group_safety:release", "group_safety:cache"),
            ids=("request_id",),
            draw=draw_accept,
            explore=explore_accept,
        ),
        EventSpec(gev.Leave, z3=("group_safety:release",), ids=("request_id",), draw=draw_free, explore=explore_free),
    ),
    invariants=GROUP_INVARIANTS,
    abstraction=lambda groups: groups.to_spec(),
    spec=spec_groups,
    impl=impl_groups,
    checks=(reads_own_tokens,),
    explored={"ci": (SMALL, SMALL_RECURRENT, SMALL_CHUNKED), "deep": DEEP},
    drain=drain,
    drained=drained,
    corpora=(
        Corpus("groups", "kvsched.testing.group_variants:VARIANTS"),
        Corpus("groups_encoding", "kvsched.proofs.group_safety:broken"),
    ),
    gaps={
        C: "the KV groups have no CrossHair contracts: their machine, explorer and z3 models check them",
        S: "safety mode does not yet read a foreign manager's groups",
    },
)
