"""Findings of a bad-input campaign run from outside the project, each pinned on spec and impl
alike: numpy ids and sizes are the integers they denote, a missing store is a typed refusal, a
cancelled id is not reused before its cancellation is reported, and a model may answer its
prefill tokens as a numpy array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvsched import impl, spec
from kvsched.spec import DuplicateRequest, EngineRequest, FinishReason, InvalidArgument, PrefixIdentity
from kvsched.spec.errors import OutputIdentityMismatch
from tests.engine.support import FLAVOURS, SMALL
from tests.engine.test_behaviour import engine


@pytest.mark.parametrize("flavour", [spec, impl], ids=["spec", "impl"])
def test_a_zero_dimensional_array_id_finishes_its_request_and_frees_the_id(flavour: Any) -> None:
    pool = flavour.BlockPool(4)
    store = flavour.PrefixKvStore(1, 2, pool=pool)
    scheduler = flavour.RequestScheduler(2, 2, pool=pool, prefixes=store)
    scheduler.admit_with_prefix(6, None, store, pool)
    scheduler.finish(np.array(6), pool)
    assert scheduler.active_count() == 0
    scheduler.admit_with_prefix(6, None, store, pool)  # the id is free again
    assert scheduler.active_count() == 1


@pytest.mark.parametrize("flavour", [spec, impl], ids=["spec", "impl"])
def test_numpy_sizes_build_the_same_objects_as_ints(flavour: Any) -> None:
    store = flavour.PrefixKvStore(np.array(3), 3)
    scheduler = flavour.RequestScheduler(np.uint64(1), np.int64(1))
    state = store.to_spec() if flavour is impl else store.state
    assert state == spec.PrefixKvStore(3, 3).state
    assert (scheduler.requests, scheduler.logical_pages) == (1, 1)
    assert type(scheduler.requests) is int and type(scheduler.logical_pages) is int


@pytest.mark.parametrize("flavour", [spec, impl], ids=["spec", "impl"])
def test_admission_with_no_store_is_a_typed_refusal_that_changes_nothing(flavour: Any) -> None:
    scheduler, pool = flavour.RequestScheduler(4, 1), flavour.BlockPool(1)
    with pytest.raises(InvalidArgument, match="prefixes must be a PrefixKvStore, not NoneType"):
        scheduler.admit_with_prefix(4, PrefixIdentity((2, 0, 0, 0)), None, pool)
    assert scheduler.active_count() == 0 and pool.free_count() == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_cancelled_id_is_refused_until_a_step_reports_the_cancellation(flavour: Any) -> None:
    subject = engine(flavour)
    subject.submit(EngineRequest(5, (1, 2, 3), 4))
    subject.submit(EngineRequest(6, (1, 2), 4))
    subject.step()
    subject.cancel(5)
    with pytest.raises(DuplicateRequest, match="request 5 is cancelled and no step has reported it yet"):
        subject.submit(EngineRequest(5, (7, 8), 1))
    with pytest.raises(DuplicateRequest, match="request 5 is cancelled"):
        subject.fork(6, 5)  # a fork's child id follows the same rule
    assert subject.step().finished == {5: FinishReason.CANCELLED}
    subject.submit(EngineRequest(5, (7, 8), 1))  # reported: the id is free again
    finished: dict[int, FinishReason] = {}
    while subject.has_work():
        finished.update(subject.step().finished)
    assert finished[5] is FinishReason.MAX_LENGTH


class ArrayAnswers:
    """The null model, answering its prefill tokens as a numpy array (or `wrong`, when set)."""

    def __init__(self, flavour: Any, wrong: object = None) -> None:
        self.model, self.wrong = flavour.NullModel(50), wrong

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def execute_prefill(self, items: Any) -> Any:
        if self.wrong is not None:
            return self.wrong
        return np.asarray(self.model.execute_prefill(items), dtype=np.int64)


def _tokens(flavour: Any, model: Any) -> dict[int, tuple[int, ...]]:
    subject = engine(flavour, SMALL, model)
    subject.submit(EngineRequest(1, (1, 2, 3), 3))
    streamed: dict[int, tuple[int, ...]] = {}
    while subject.has_work():
        for request_id, tokens in subject.step().tokens.items():
            streamed[request_id] = streamed.get(request_id, ()) + tuple(tokens)
    return streamed


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_model_may_answer_its_prefill_tokens_as_a_numpy_array(flavour: Any) -> None:
    assert _tokens(flavour, ArrayAnswers(flavour)) == _tokens(flavour, flavour.NullModel(50))


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        ("x", "answered a str, not a sequence of tokens"),
        (7, "answered a int, not a sequence of tokens"),
        ([], "answered 0 tokens for 1 chunks"),
        (np.array([1.5]), "answered np.float64(1.5) for chunk 0: not a token"),
        ([2**32], "answered 4294967296 for chunk 0: not a token"),
    ],
)
def test_a_wrong_prefill_answer_names_what_is_wrong_and_changes_nothing(
    flavour: Any, wrong: object, message: str
) -> None:
    subject = engine(flavour, SMALL, ArrayAnswers(flavour, wrong))
    subject.submit(EngineRequest(1, (1, 2, 3), 3))
    before = subject.to_spec()
    with pytest.raises(OutputIdentityMismatch, match=message.replace("(", r"\(").replace(")", r"\)")):
        subject.step()
    assert subject.to_spec() == before
