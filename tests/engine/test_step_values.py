"""The spec's step is a function on values: `plan_step` decides it without the model, `run_model`
makes exactly the calls the plan names, `commit_step` applies the answers, and the state a step
ran on is never changed, whatever the model does."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import replace

import pytest

from kvsched import spec
from kvsched.spec import EngineRequest
from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.engine_calls import NO_ANSWERS, ModelCalls, run_model
from kvsched.spec.engine_step import commit_step, plan_step, run_step
from kvsched.spec.errors import BackendFailed
from kvsched.spec.model import NullModel, PrefillItem
from tests.engine.support import SMALL

CONFIG = replace(SMALL, prefix_caching=True)


class RecordingModel(NullModel):
    """The null model, every call recorded; it raises on the call numbered `fail_at`."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []
        self.fail_at = fail_at

    def _record(self, name: str, argument: object) -> None:
        if len(self.calls) == self.fail_at:
            raise RuntimeError("the model failed")
        self.calls.append((name, argument))

    def copy_pages(self, pairs: Sequence[tuple[int, int]]) -> None:
        self._record("copy_pages", tuple(pairs))
        super().copy_pages(pairs)

    def execute_prefill(self, items: Sequence[PrefillItem]) -> Sequence[int]:
        self._record("execute_prefill", tuple(items))
        return super().execute_prefill(items)

    def execute_ragged(
        self, items: Sequence[RaggedBatchItem], block_tables: Sequence[int], out: MutableSequence[RaggedBatchOutput]
    ) -> RaggedBatchReceipt:
        self._record("execute_ragged", (tuple(items), tuple(block_tables)))
        return super().execute_ragged(items, block_tables, out)


def expected_calls(calls: ModelCalls) -> list[tuple[str, object]]:
    """The calls a plan names, in the model boundary's order."""
    made: list[tuple[str, object]] = []
    if calls.items:
        if calls.decode_copies:
            made.append(("copy_pages", calls.decode_copies))
        made.append(("execute_ragged", (calls.items, calls.tables)))
    if calls.prefill_copies:
        made.append(("copy_pages", calls.prefill_copies))
    if calls.prefills:
        made.append(("execute_prefill", calls.prefills))
    return made


def busy_engine() -> spec.Engine:
    """An engine with one request decoding (forked, so its next write copies a page) and two
    queued, one sharing its prompt's first page."""
    engine = spec.Engine(CONFIG, NullModel())
    engine.submit(EngineRequest(1, (1, 2, 3), 6))
    engine.step()
    engine.fork(1, 2)
    engine.submit(EngineRequest(3, (1, 2, 9, 9, 9), 4))
    engine.submit(EngineRequest(4, (5,), 4))
    return engine


def test_a_step_makes_exactly_the_calls_its_plan_names() -> None:
    engine = busy_engine()
    seen_all: set[str] = set()
    while engine.has_work():
        before = engine.state
        plan = plan_step(before, CONFIG)
        model = RecordingModel()
        state, output = run_step(before, CONFIG, model)
        assert engine.state == before  # the value a step ran on is unchanged
        assert model.calls == ([] if plan.calls is None else expected_calls(plan.calls))
        seen_all |= {name for name, _ in model.calls}
        answers = NO_ANSWERS if plan.calls is None else run_model(plan.calls, NullModel())
        assert commit_step(plan, answers, CONFIG) == (state, output)
        assert engine.step() == output
        assert engine.state == state
    assert seen_all == {"copy_pages", "execute_ragged", "execute_prefill"}


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_failed_call_leaves_the_engine_as_it_was(fail_at: int) -> None:
    engine = busy_engine()
    engine.model = RecordingModel(fail_at)
    before = engine.state
    plan = plan_step(before, CONFIG)
    assert plan.calls is not None and len(expected_calls(plan.calls)) > fail_at
    with pytest.raises(BackendFailed):
        engine.step()
    assert engine.state == before
