"""The engine's promises, one at a time, on spec and impl alike: the intake's refusals and their
order, cancellation anywhere, priority and FIFO, the memory guard, preemption to the front of
the class, a full prefix hit that still prefills, state slots, and atomicity of a failed step."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.spec import EngineConfig, EngineRequest, FinishReason, InvalidConfig
from kvsched.spec.engine_state import check_engine_invariants
from kvsched.spec.model import null_next_token
from tests.engine.support import FLAVOURS, SMALL, greedy, run_to_completion


def engine(flavour: Any, config: EngineConfig = SMALL, model: Any = None) -> Any:
    return flavour.Engine(config, model if model is not None else flavour.NullModel(50))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_intake_checks_queue_full_then_duplicate_then_too_large(flavour: Any) -> None:
    subject = engine(flavour)
    for request_id in range(1, 5):
        subject.submit(EngineRequest(request_id, (1, 2), 2))
    before = subject.to_spec()
    with pytest.raises(spec.QueueFull):
        subject.submit(EngineRequest(1, (1,) * 20, 2))  # also a duplicate and too large
    assert subject.to_spec() == before
    subject.step()  # all four admitted: the queue is empty again
    with pytest.raises(spec.DuplicateRequest):
        subject.submit(EngineRequest(1, (1,) * 20, 2))  # also too large
    with pytest.raises(spec.RequestTooLarge):
        subject.submit(EngineRequest(9, (1,) * 15, 2))  # 17 tokens over max_seq_len 16
    with pytest.raises(spec.InvalidArgument):
        subject.submit((9, (1,), 2))
    assert subject.to_spec().queue == ()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    ("config", "prompt", "new"),
    [
        (SMALL, 15, 2),  # over max_seq_len
        (replace(SMALL, logical_pages=4), 7, 2),  # over one table (4 x 2 tokens)
        (replace(SMALL, pages=4), 7, 2),  # 5 pages, over the pool
    ],
)
def test_a_request_that_can_never_run_is_refused_and_never_blocks_the_queue(
    flavour: Any, config: EngineConfig, prompt: int, new: int
) -> None:
    """vLLM #39734: a request larger than the cache blocked the queue forever."""
    subject = engine(flavour, config)
    with pytest.raises(spec.RequestTooLarge):
        subject.submit(EngineRequest(1, (3,) * prompt, new))
    subject.submit(EngineRequest(2, (3, 4), 3))
    tokens, finished = run_to_completion(subject)
    assert tokens[2] == greedy((3, 4), 3, vocab=50)
    assert finished == {2: FinishReason.MAX_LENGTH}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("when", ["queued", "prefilling", "decoding"])
def test_cancel_releases_exactly_as_finish_and_reports_once(flavour: Any, when: str) -> None:
    config = replace(SMALL, chunk_size=1, max_batch_size=1, max_batched_tokens=1)
    subject = engine(flavour, config)
    subject.submit(EngineRequest(1, (5, 6, 7), 4))
    subject.submit(EngineRequest(2, (8,), 2))
    steps = {"queued": 0, "prefilling": 1, "decoding": 3}[when]
    for _ in range(steps):
        subject.step()
    target = 2 if when == "queued" else 1
    subject.cancel(target)
    assert not check_engine_invariants(subject.to_spec())
    with pytest.raises(spec.UnknownRequest):
        subject.cancel(target)
    output = subject.step()
    assert output.finished.get(target) is FinishReason.CANCELLED
    _, finished = run_to_completion(subject)
    assert target not in finished
    assert len(subject.to_spec().system.pool.free) == config.pages
    with pytest.raises(spec.UnknownRequest):
        subject.cancel(target)  # finished ids are forgotten


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_strict_priority_then_fifo(flavour: Any) -> None:
    config = replace(SMALL, max_batch_size=1, max_batched_tokens=4)
    subject = engine(flavour, config)
    for request_id, priority in [(1, 0), (2, 1), (3, 0), (4, 1)]:
        subject.submit(EngineRequest(request_id, (request_id,), 1, priority=priority))
    order = []
    while subject.has_work():
        order.extend(subject.step().finished)
    assert order == [2, 4, 1, 3]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_memory_guard_blocks_admission_but_never_an_empty_batch(flavour: Any) -> None:
    config = replace(SMALL, prefill_reserve_pages=8)  # never 8 free while running
    subject = engine(flavour, config)
    subject.submit(EngineRequest(1, (1, 2), 3))
    subject.submit(EngineRequest(2, (3, 4), 3))
    first = subject.step()
    assert set(first.tokens) == {1}  # the empty batch admitted one; the guard held the other back
    tokens, _ = run_to_completion(subject)
    assert tokens[2] == greedy((3, 4), 3, vocab=50)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_preempted_request_keeps_its_place_and_its_tokens(flavour: Any) -> None:
    """vLLM #41951: a preempted request lost its place in line; vLLM #45388: KV pressure
    deadlocked the scheduler. Here the latest request is preempted to the front of its class,
    readmitted before a later arrival, and every request's tokens are its greedy tokens."""
    config = replace(SMALL, pages=5, max_batch_size=2)
    subject = engine(flavour, config)
    subject.submit(EngineRequest(1, (1, 2, 3), 6))
    subject.submit(EngineRequest(2, (4, 5, 6), 6))
    first = subject.step()
    subject.submit(EngineRequest(3, (7,), 2))  # arrives after both, waits for a seat
    preempted: list[int] = []
    admitted_after: list[int] = []
    tokens: dict[int, list[int]] = {1: [], 2: [], 3: []}
    for request_id, new in first.tokens.items():
        tokens[request_id].extend(new)
    while subject.has_work():
        output = subject.step()
        preempted.extend(output.preempted)
        for request_id, new in output.tokens.items():
            tokens[request_id].extend(new)
        state = subject.to_spec()
        for entry in state.running:  # in admission order
            if preempted and entry.request.request_id not in admitted_after:
                admitted_after.append(entry.request.request_id)
        assert not check_engine_invariants(state)
    assert preempted[0] == 2  # the latest admitted
    assert admitted_after.index(2) < admitted_after.index(3)
    for request_id, prompt, new in [(1, (1, 2, 3), 6), (2, (4, 5, 6), 6), (3, (7,), 2)]:
        assert tokens[request_id] == greedy(prompt, new, vocab=50)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_full_prefix_hit_still_prefills_one_token(flavour: Any) -> None:
    """nano-vllm PR #199: a prompt that was a full prefix hit prefilled zero tokens and read
    another request's logits. Here it recomputes its last prompt token into a copy of the
    shared page and samples from that."""
    config = replace(SMALL, prefix_entries=2)
    model = flavour.NullModel(50)
    subject = engine(flavour, config, model)
    prompt = (9, 8, 7, 6)
    subject.submit(EngineRequest(1, prompt, 3))
    subject.step()
    identity = spec.derive_prefix_identity(1, 2, 3, 4, [])
    subject.publish(1, 4, identity)
    subject.submit(EngineRequest(2, prompt, 3, prefix=identity))
    copies = model.copies
    output = subject.step()
    assert output.tokens[2] == (null_next_token(6, 3, 50),)
    assert output.tokens_run == 1 + 1  # request 1 decoded one token, request 2 prefilled one
    assert model.copies == copies + 1  # its one write went to a copy of the shared page
    tokens, _ = run_to_completion(subject)
    assert [*output.tokens[2], *tokens[2]] == greedy(prompt, 3, vocab=50)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_state_slots_gate_admission_and_are_released_with_the_pages(flavour: Any) -> None:
    config = replace(SMALL, state_slots=1)
    subject = engine(flavour, config)
    subject.submit(EngineRequest(1, (1, 2), 2))
    subject.submit(EngineRequest(2, (3, 4), 2))
    subject.step()
    state = subject.to_spec()
    assert [entry.request.request_id for entry in state.running] == [1]
    assert state.state_slots == (1,)
    tokens, _ = run_to_completion(subject)
    assert tokens[2] == greedy((3, 4), 2, vocab=50)
    assert subject.to_spec().state_slots == (None,)


class Failing:
    """A null model whose calls raise while `failing` is set."""

    def __init__(self, flavour: Any) -> None:
        self.inner = flavour.NullModel(50)
        self.failing = ""

    def copy_pages(self, pairs: Any) -> None:
        self.inner.copy_pages(pairs)

    def execute_prefill(self, items: Any) -> Any:
        if self.failing == "prefill":
            raise RuntimeError("prefill failed")
        return self.inner.execute_prefill(items)

    def execute_ragged(self, items: Any, tables: Any, out: Any) -> Any:
        if self.failing == "decode":
            raise RuntimeError("decode failed")
        return self.inner.execute_ragged(items, tables, out)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_model_failure_leaves_the_engine_exactly_as_before(flavour: Any, where: str) -> None:
    config = replace(SMALL, pages=5, chunk_size=2)
    model = Failing(flavour)
    subject = engine(flavour, config, model)
    subject.submit(EngineRequest(1, (1, 2, 3), 5))
    subject.step()
    subject.submit(EngineRequest(2, (4, 5, 6), 5))
    subject.cancel(1)
    subject.submit(EngineRequest(3, (7, 8), 5))
    for _ in range(2):
        subject.step()
    subject.submit(EngineRequest(4, (9,), 2))  # a prefill in the failing step
    model.failing = where
    before = subject.to_spec()
    with pytest.raises(spec.BackendFailed):
        subject.step()
    assert subject.to_spec() == before
    model.failing = ""
    run_to_completion(subject)  # the retried step and the rest: invariants after each
    assert len(subject.to_spec().system.pool.free) == config.pages


def test_both_flavours_export_the_pinned_names() -> None:
    for flavour in (spec, impl):
        for name in ("Engine", "EngineConfig", "EngineRequest", "StepOutput", "NullModel", "FinishReason"):
            assert hasattr(flavour, name), (flavour.__name__, name)
    assert impl.EngineConfig is spec.EngineConfig and impl.StepOutput is spec.StepOutput


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("admission", ["whole_prompt", "first_chunk"])
def test_whole_prompt_admission_waits_for_room_instead_of_thrashing(flavour: Any, admission: str) -> None:
    """Two 10-token prompts in 8 pages of 2: admitted together (first chunk free), their prefills
    preempt each other; under whole-prompt admission the second waits until the first's rest is
    accounted for, and nothing is ever preempted."""
    config = replace(SMALL, pages=8, page_size=2, chunk_size=2, max_batched_tokens=4, admission=admission)
    subject = engine(flavour, config)
    for request_id in (1, 2):
        subject.submit(EngineRequest(request_id, tuple(range(1, 11)), 1))
    first = subject.step()
    assert first.tokens_run == (2 if admission == "whole_prompt" else 4)
    preempted = len(first.preempted)
    while subject.has_work():
        preempted += len(subject.step().preempted)
    assert (preempted == 0) == (admission == "whole_prompt")


def test_an_unknown_admission_policy_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="admission must be one of whole_prompt, first_chunk"):
        replace(SMALL, admission="greedy")
    not_a_name: Any = 1
    with pytest.raises(InvalidConfig, match="admission must be a str"):
        replace(SMALL, admission=not_a_name)
