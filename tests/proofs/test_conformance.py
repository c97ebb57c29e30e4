"""The z3 model is tied to the spec: every concrete spec step satisfies the model's relation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.proofs import broken
from kvsched.proofs.conformance import conforms
from kvsched.proofs.explorer import attempt
from kvsched.proofs.operations import Bounds, Operation, alphabet, static_alphabet
from kvsched.proofs.subject import SPEC, load, snapshot
from kvsched.proofs.transitions import Encoding
from kvsched.spec.system import SystemState

BOUNDS = Bounds(requests=2, pages=3, logical_pages=2, entries=1, entry_pages=2, max_references=3, max_tokens=3)
STATIC = static_alphabet(BOUNDS)

SCENARIO = [
    Operation("ext_allocate"),
    Operation("ext_allocate"),
    Operation("ext_retain", (0,)),
    Operation("publish", (0, (0, 1), 1)),
    Operation("publish", (1, (0, 1, 2), 1)),  # over the entry capacity
    Operation("ext_release", (0,)),
    Operation("ext_release", (0,)),
    Operation("ext_release", (1,)),
    Operation("ext_retain", (2,)),  # a free page
    Operation("admit", (0, 0)),  # a prefix hit
    Operation("admit", (0, None)),  # a duplicate
    Operation("ensure_writable", (0, 0)),  # copy-on-write
    Operation("ensure_writable", (0, 0)),  # now exclusive
    Operation("ensure_writable", (0, 2)),  # out of range
    Operation("seed_decode_token", (0, 0)),
    Operation("fork", (0, 1)),
    Operation("ext_retain", (1,)),  # past max_references
    Operation("fork", (0, 1)),  # the child id is live
    Operation("decode", ("corrupt_identity", "")),
    Operation("decode", ("none", "")),
    Operation("mark_prefill_complete", (0,)),  # already decoding
    Operation("prepare_decode_round", (2,)),  # the shared page cannot be copied: no page is free
    Operation("prepare_decode_round", (0,)),
    Operation("record_token", (1,)),
    Operation("finish", (1,)),
    Operation("finish", (1,)),  # twice
    Operation("admit", (1, None)),  # a miss
    Operation("mark_prefill_complete", (1,)),
    Operation("decode", ("none", "")),  # slot 1 has no input token
    Operation("publish", (1, (2,), 1)),  # replaces the only entry
    Operation("reclaim", (3,)),  # nothing idle: request 0 still maps page 2
    Operation("ensure_writable_batch", ((1, 0), (0, 2))),  # the second step fails: nothing changes
    Operation("ensure_writable_batch", ((1, 0), (0, 1))),
    Operation("finish", (1,)),
    Operation("admit", (1, None)),
    Operation("mark_prefill_complete", (1,)),
    Operation("prepare_decode_round", (2,)),
    Operation("seed_decode_token", (1, 0)),
    Operation("decode", ("none", "")),  # request 0 still shares its page: refused
    Operation("finish", (0,)),
    Operation("prepare_decode_round", (2,)),  # a page is free now
    Operation("decode", ("none", "")),  # request 1 writes its own page: the round commits
    Operation("reclaim", (3,)),  # evicts the now idle entry
    Operation("ext_allocate"),
    Operation("publish", (0, (2,), 1)),
    Operation("remove", (0,)),
    Operation("remove", (0,)),
    Operation("reclaim", (-1,)),
    Operation("finish", (1,)),
]


def _steps(ops: list[Operation]) -> list[tuple[Operation, tuple[str, object], SystemState, SystemState]]:
    sut = SPEC.factory(BOUNDS.config())
    state = snapshot(sut, ())
    steps = []
    for operation in ops:
        outcome, post = attempt(operation, sut, state, BOUNDS)
        steps.append((operation, outcome, state, post))
        state = post
    return steps


def test_the_scenario_conforms_step_by_step() -> None:
    steps = _steps(SCENARIO)
    assert [op for op, _, before, after in steps if not conforms(Encoding(), op, before, after, BOUNDS)] == []


def test_the_scenario_exercises_every_transition() -> None:
    steps = _steps(SCENARIO)
    succeeded = {op.kind for op, outcome, before, after in steps if outcome[0] == "returns" and before != after}
    refused = {op.kind for op, outcome, _, _ in steps if outcome[0] == "raises"}
    assert succeeded == {op.kind for op in STATIC} | {"ext_release"}
    assert {"admit", "fork", "ensure_writable", "ext_retain", "decode", "finish", "publish"} <= refused
    cow = [outcome for op, outcome, _, _ in steps if op.kind == "ensure_writable" and outcome[0] == "returns"]
    assert ("Copy", 0, 2) in [result for _, result in cow]


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


def _successful(state: SystemState) -> list[Operation]:
    """The operations that change `state` (so a random walk goes somewhere)."""
    sut = SPEC.factory(BOUNDS.config())
    moves = []
    for operation in alphabet(state, BOUNDS, STATIC):
        load(sut, state)
        outcome, post = attempt(operation, sut, state, BOUNDS, results=False)
        if outcome[0] == "returns" and post != state:
            moves.append(operation)
    return moves


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_random_walks_conform(data: st.DataObject) -> None:
    sut = SPEC.factory(BOUNDS.config())
    state = snapshot(sut, ())
    for _ in range(12):
        moves = _successful(state)
        wander = data.draw(st.booleans(), label="try any operation") or not moves
        pool = sorted(alphabet(state, BOUNDS, STATIC), key=repr) if wander else sorted(moves, key=repr)
        operation = data.draw(st.sampled_from(pool), label="operation")
        load(sut, state)
        _, post = attempt(operation, sut, state, BOUNDS)
        assert conforms(Encoding(), operation, state, post, BOUNDS), f"the model does not allow {operation}"
        state = post
