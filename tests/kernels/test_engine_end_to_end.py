"""The engine serving the real paged model: every request's greedy tokens, under chunked
prefill, batching, preemption by recompute, a published prefix attached by a later request (its
first write a copy of the shared page) and a fork of a running request, equal a dense,
cache-free run of that request alone. On the numpy and cpu devices for spec and impl, and in the
CUDA simulator on a small case."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.kernels import ModelConfig, PagedBackend, init_weights
from kvsched.kernels.model import greedy_reference
from kvsched.spec import EngineConfig, EngineRequest
from tests.engine.support import run_to_completion

PAGE_SIZE = 4
SHARED = (11, 3, 57, 20, 8, 41, 9)  # seven tokens: one full page and most of the next


class CountingBackend(PagedBackend):
    """The paged backend, counting the pages it copies."""

    copies = 0

    def copy_pages(self, pairs: Any) -> None:
        self.copies += len(pairs)
        super().copy_pages(pairs)


def serve(
    flavour: Any,
    device: str,
    requests: list[EngineRequest],
    pages: int,
    attach: set[int],
    fork_into: int | None = None,
) -> tuple[Any, dict[int, list[int]], int, int]:
    """Serve `requests`: the first alone until its prompt is computed, then it publishes
    `SHARED` and the rest arrive, those in `attach` naming it (and `fork_into`, if given, forks
    it); the weights, every request's tokens (a fork's from its parent's first), the
    preemptions and the pages copied."""
    config = EngineConfig(
        requests=4,
        pages=pages,
        page_size=PAGE_SIZE,
        logical_pages=6,
        max_batch_size=4,
        max_batched_tokens=8,
        chunk_size=3,
        prefill_reserve_pages=1,
        max_queue=8,
        max_seq_len=24,
        prefix_entries=2,
    )
    # kv_heads=1 (GQA group 4) keeps the simulated CUDA grid at one block per query token.
    weights = init_weights(ModelConfig(q_heads=4, kv_heads=1, page_size=PAGE_SIZE, cache_dtype="float32"), seed=2024)
    backend = CountingBackend(weights, pages, device)
    engine = flavour.Engine(config, backend)
    identity = spec.derive_prefix_identity(7, 1, 2, 3, [])
    first, *rest = requests
    engine.submit(first)
    tokens: dict[int, list[int]] = {}
    preempted = 0
    while len(tokens.get(first.request_id, [])) == 0:  # until the first request's prompt is computed
        output = engine.step()
        preempted += len(output.preempted)
        for request_id, new in output.tokens.items():
            tokens.setdefault(request_id, []).extend(new)
    engine.publish(first.request_id, len(SHARED), identity)
    forked = list(tokens[first.request_id])
    if fork_into is not None:  # a copy of the first request from here on, sharing its pages
        engine.fork(first.request_id, fork_into)
        tokens[fork_into] = list(forked)
    for request in rest:
        engine.submit(
            request
            if request.prefix is None
            else EngineRequest(request.request_id, request.prompt, request.max_new_tokens, prefix=identity)
        )
    while engine.has_work():
        output = engine.step()
        preempted += len(output.preempted)
        for request_id, new in output.tokens.items():
            tokens.setdefault(request_id, []).extend(new)
    later, _ = run_to_completion(engine)
    assert not later
    return weights, tokens, preempted, backend.copies


REQUESTS = [
    EngineRequest(1, SHARED, 5),
    EngineRequest(2, (*SHARED, 30, 2), 5),  # attaches SHARED
    EngineRequest(3, (9, 9, 1, 52, 33, 7, 18, 4), 6),
    EngineRequest(4, (5, 14, 2, 60, 1), 6),
]


@pytest.mark.parametrize(
    ("flavour", "device"),
    [
        pytest.param(spec, "numpy", id="spec-numpy"),
        pytest.param(impl, "cpu", id="impl-cpu"),
        pytest.param(spec, "cpu", id="spec-cpu"),
    ],
)
def test_engine_tokens_equal_each_request_run_alone(flavour: Any, device: str) -> None:
    weights, tokens, preempted, copies = serve(flavour, device, REQUESTS, pages=10, attach={2}, fork_into=5)
    assert preempted > 0  # the pool is too small for all five at once
    assert copies > 0  # request 2's first write, and the fork's, went to copies of shared pages
    for request in REQUESTS:
        dense, _ = greedy_reference(weights, request.prompt, request.max_new_tokens)
        assert tokens[request.request_id] == dense, request.request_id
    assert tokens[5] == tokens[1]  # the fork: the same request, greedy


def test_engine_in_the_cuda_simulator(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("cuda_mode")
    small = [EngineRequest(1, SHARED, 2), EngineRequest(2, (*SHARED, 30), 2)]
    weights, tokens, _, copies = serve(spec, "cuda", small, pages=6, attach={2})
    assert copies > 0
    for each in small:
        dense, _ = greedy_reference(weights, each.prompt, each.max_new_tokens)
        assert tokens[each.request_id] == dense
