"""The z3 model is tied to the spec: every concrete spec step (`kvsched.spec.step.step`, the
spec's pure transition on a whole state) satisfies the model's relation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.proofs import broken
from kvsched.proofs.conformance import conforms
from kvsched.proofs.operations import Bounds, alphabet, identity, static_alphabet
from kvsched.proofs.subject import SPEC, snapshot
from kvsched.proofs.transitions import Encoding
from kvsched.spec import events as ev
from kvsched.spec.events import Event
from kvsched.spec.pool import Copy
from kvsched.spec.step import step
from kvsched.spec.system import SystemState
from kvsched.testing.backends import backend_for
from kvsched.testing.checks import Outcome, capture

BOUNDS = Bounds(requests=2, pages=3, logical_pages=2, entries=1, entry_pages=2, max_references=3, max_tokens=3)
STATIC = static_alphabet(BOUNDS)

SCENARIO: list[Event] = [
    ev.Allocate(),
    ev.Allocate(),
    ev.Retain(0),
    ev.Publish(identity(0), (0, 1), 1),
    ev.Publish(identity(1), (0, 1, 2), 1),  # over the entry capacity
    ev.Release(0),
    ev.Release(0),
    ev.Release(1),
    ev.Retain(2),  # a free page
    ev.Admit(0, identity(0)),  # a prefix hit
    ev.Admit(0, None),  # a duplicate
    ev.EnsureWritable(0, 0),  # copy-on-write
    ev.EnsureWritable(0, 0),  # now exclusive
    ev.EnsureWritable(0, 2),  # out of range
    ev.SeedDecodeToken(0, 0),
    ev.Fork(0, 1),
    ev.Retain(1),  # past max_references
    ev.Fork(0, 1),  # the child id is live
    ev.DecodeRound(ev.Fault.CORRUPT_IDENTITY),
    ev.DecodeRound(ev.Fault.NONE),
    ev.MarkPrefillComplete(0),  # already decoding
    ev.PrepareDecodeRound(2),  # the shared page cannot be copied: no page is free
    ev.PrepareDecodeRound(0),
    ev.RecordToken(1),
    ev.Finish(1),
    ev.Finish(1),  # twice
    ev.Admit(1, None),  # a miss
    ev.MarkPrefillComplete(1),
    ev.DecodeRound(ev.Fault.NONE),  # slot 1 has no input token
    ev.Publish(identity(1), (2,), 1),  # replaces the only entry
    ev.Reclaim(3),  # nothing idle: request 0 still maps page 2
    ev.EnsureWritableBatch((1, 0), (0, 2)),  # the second step fails: nothing changes
    ev.EnsureWritableBatch((1, 0), (0, 1)),
    ev.Finish(1),
    ev.Admit(1, None),
    ev.MarkPrefillComplete(1),
    ev.PrepareDecodeRound(2),
    ev.SeedDecodeToken(1, 0),
    ev.DecodeRound(ev.Fault.NONE),  # request 0 still shares its page: refused
    ev.Finish(0),
    ev.PrepareDecodeRound(2),  # a page is free now
    ev.DecodeRound(ev.Fault.NONE),  # request 1 writes its own page: the round commits
    ev.Reclaim(3),  # evicts the now idle entry
    ev.Allocate(),
    ev.Publish(identity(0), (2,), 1),
    ev.Remove(identity(0)),
    ev.Remove(identity(0)),
    ev.Reclaim(-1),
    ev.RecordTokens(1, 2),
    ev.Finish(1),
    ev.ForeignPool(1, "finish"),
    ev.DecodeOverlapping(),
]


def spec_step(state: SystemState, event: Event) -> tuple[Outcome, SystemState]:
    """The spec's transition: its outcome, and the state after it (`state` when refused)."""
    backend = backend_for(event, BOUNDS.page_size)
    outcome = capture(lambda: step(state, event, page_size=BOUNDS.page_size, backend=backend))
    if outcome.error is not None:
        return outcome, state
    after, result = outcome.value
    return Outcome(result), after


def _steps(events: list[Event]) -> list[tuple[Event, Outcome, SystemState, SystemState]]:
    state = snapshot(SPEC.factory(BOUNDS.config()), ())
    steps = []
    for event in events:
        outcome, post = spec_step(state, event)
        steps.append((event, outcome, state, post))
        state = post
    return steps


def test_the_scenario_conforms_step_by_step() -> None:
    steps = _steps(SCENARIO)
    assert [op for op, _, before, after in steps if not conforms(Encoding(), op, before, after, BOUNDS)] == []


def test_the_scenario_exercises_every_transition() -> None:
    steps = _steps(SCENARIO)
    succeeded = {type(op) for op, outcome, before, after in steps if outcome.error is None and before != after}
    refused = {type(op) for op, outcome, _, _ in steps if outcome.error is not None}
    always_refused = {ev.ForeignPool, ev.DecodeOverlapping}
    assert succeeded == {type(op) for op in STATIC} - always_refused | {ev.Release}
    assert {ev.Admit, ev.Fork, ev.EnsureWritable, ev.Retain, ev.DecodeRound, ev.Finish, ev.Publish} <= refused
    cow = [outcome.value for op, outcome, _, _ in steps if isinstance(op, ev.EnsureWritable) and outcome.error is None]
    assert Copy(0, 2) in cow


DRIFTS = (
    broken.FifoAllocate,
    broken.AllocateLeavesPageFree,
    broken.RetainFreePage,
    broken.ReleaseSkipsPush,
    broken.WriteSharedInPlace,
    broken.AdmitDuplicate,
    broken.FinishLeaksPages,
    broken.PublishKeepsReplaced,
    broken.EvictWithoutRelease,
    broken.RoundAdvancesEverySlot,
    broken.HitCountsNoTokens,
    broken.ForkKeepsParentId,
)


@pytest.mark.parametrize("drifted", DRIFTS, ids=lambda cls: cls.__name__)
def test_a_drifted_model_fails_conformance(drifted: type[Encoding]) -> None:
    steps = _steps(SCENARIO)
    rejected = [op for op, _, before, after in steps if not conforms(drifted(), op, before, after, BOUNDS)]
    assert rejected, f"{drifted.__name__} conforms to the spec on every step"


def _successful(state: SystemState) -> list[Event]:
    """The events that change `state` (so a random walk goes somewhere)."""
    moves = []
    for event in alphabet(state, BOUNDS, STATIC):
        outcome, post = spec_step(state, event)
        if outcome.error is None and post != state:
            moves.append(event)
    return moves


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_random_walks_conform(data: st.DataObject) -> None:
    state = snapshot(SPEC.factory(BOUNDS.config()), ())
    for _ in range(12):
        moves = _successful(state)
        wander = data.draw(st.booleans(), label="try any operation") or not moves
        pool = sorted(alphabet(state, BOUNDS, STATIC), key=repr) if wander else sorted(moves, key=repr)
        event = data.draw(st.sampled_from(pool), label="event")
        _, post = spec_step(state, event)
        assert conforms(Encoding(), event, state, post, BOUNDS), f"the model does not allow {event!r}"
        state = post
