"""Requests served through the scheduler over the paged cache produce the dense reference's
greedy tokens, on every device: a published shared prefix attached at admission, copy-on-write
after the attach and after a fork, and a slot (and its pages) reused after a request finishes.

Flow for one request (`Serving.start`): admit -> `ensure_writable` every page the prompt's
uncached tokens land on (copying on `Copy`) -> backend prefill of those tokens -> `record_token`
per token -> `mark_prefill_complete` (unless admitted into DECODE by a prefix hit) ->
`seed_decode_token(first generated)`. Per round (`Serving.round`): `ensure_writable` of the page
each decoding request writes next, one batched page copy, then `execute_decode_round`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kvsched import impl, spec
from kvsched.kernels import ModelConfig, PagedBackend, Weights, init_weights, reference_logits

PAGE_SIZE = 4
REQUESTS = 3
LOGICAL_PAGES = 6
PHYSICAL_PAGES = 24
# Logits: float32 projections and kernel summation order against a float64-attention reference.
RTOL = ATOL = 2e-4


class Serving:
    """A minimal serving loop over one scheduler flavour (spec or impl) and one backend."""

    def __init__(self, flavour: Any, backend: PagedBackend, weights: Weights) -> None:
        self.flavour = flavour
        self.backend = backend
        self.weights = weights
        self.pool = flavour.BlockPool(PHYSICAL_PAGES)
        self.store = flavour.PrefixKvStore(2, LOGICAL_PAGES)
        self.sched = flavour.RequestScheduler(REQUESTS, LOGICAL_PAGES, page_size=PAGE_SIZE)
        self.sequences: dict[int, list[int]] = {}  # request id -> tokens so far (last not yet in KV)
        self.copies = 0
        if flavour is spec:
            self.items: Any = [spec.RaggedBatchItem()] * REQUESTS
            self.tables: Any = [0] * (REQUESTS * LOGICAL_PAGES)
            self.outputs: Any = [spec.RaggedBatchOutput()] * REQUESTS
        else:
            self.items = impl.empty_items(REQUESTS)
            self.tables = np.zeros(REQUESTS * LOGICAL_PAGES, dtype=np.uint32)
            self.outputs = impl.empty_outputs(REQUESTS)

    def make_writable(self, writes: Sequence[tuple[int, int]]) -> None:
        """`ensure_writable` each (request, logical page), then one batched copy of the Copies."""
        pairs = []
        for request, logical in writes:
            action = self.sched.ensure_writable(request, logical, self.pool)
            if isinstance(action, spec.Copy):
                pairs.append((action.source, action.destination))
        if pairs:
            self.backend.copy_pages(pairs)
            self.copies += len(pairs)

    def start(self, request: int, prompt: list[int], identity: Any = None) -> Any:
        admission = self.sched.admit_with_prefix(request, identity, self.store, self.pool)
        cached = admission.prefix_tokens
        self.make_writable([(request, page) for page in range(cached // PAGE_SIZE, (len(prompt) - 1) // PAGE_SIZE + 1)])
        logits = self.backend.prefill(prompt[cached:], cached, self.sched.page_table(request))
        expected = reference_logits(self.weights, prompt)[cached:]
        np.testing.assert_allclose(logits, expected, rtol=RTOL, atol=ATOL)
        for _ in prompt[cached:]:
            self.sched.record_token(request)
        if not admission.prefix_hit:
            self.sched.mark_prefill_complete(request)
        first = int(np.argmax(logits[-1]))
        assert first == int(np.argmax(expected[-1]))
        self.sched.seed_decode_token(request, first)
        self.sequences[request] = [*prompt, first]
        return admission

    def decoding(self) -> list[Any]:
        views: list[Any] = [None] * REQUESTS
        count = self.sched.runnable_into(views)
        return [view for view in views[:count] if view.state is spec.RequestState.DECODE]

    def round(self) -> None:
        decoding = self.decoding()
        for view in decoding:
            assert view.token_count == len(self.sequences[view.request_id]) - 1
        self.make_writable([(view.request_id, view.token_count // PAGE_SIZE) for view in decoding])
        receipt = self.sched.execute_decode_round(self.backend, self.items, self.tables, self.outputs)
        assert (receipt.batch_size, receipt.backend_launches) == (len(decoding), 1)
        for index in range(len(decoding)):
            request, token = self._output(index)
            sequence = self.sequences[request]
            expected = reference_logits(self.weights, sequence)[-1]
            np.testing.assert_allclose(self.backend.last_logits[index], expected, rtol=RTOL, atol=ATOL)
            assert token == int(np.argmax(expected)), f"request {request} diverged at position {len(sequence)}"
            sequence.append(token)

    def _output(self, index: int) -> tuple[int, int]:
        output = self.outputs[index]
        if self.flavour is spec:
            return output.request_id, output.next_token_id
        return int(output["request_id"]), int(output["next_token_id"])


CASES = [
    pytest.param("numpy", "float32", spec, id="numpy-f32-spec"),
    pytest.param("cpu", "float32", spec, id="cpu-f32-spec"),
    pytest.param("cpu", "float16", spec, id="cpu-f16-spec"),
    pytest.param("numpy", "float16", spec, id="numpy-f16-spec"),
    pytest.param("cpu", "float32", impl, id="cpu-f32-impl"),
    pytest.param("cuda", "float16", spec, id="cuda-f16-spec"),
]


@pytest.mark.parametrize(("device", "cache_dtype", "flavour"), CASES)
def test_served_requests_match_the_dense_reference(
    request: pytest.FixtureRequest, device: str, cache_dtype: str, flavour: Any
) -> None:
    if device == "cuda":
        request.getfixturevalue("cuda_mode")
    # kv_heads=1 (GQA group 4) keeps the simulated CUDA grid at one block per query token.
    config = ModelConfig(q_heads=4, kv_heads=1, page_size=PAGE_SIZE, cache_dtype=cache_dtype)
    weights = init_weights(config, seed=2024)
    serving = Serving(flavour, PagedBackend(weights, PHYSICAL_PAGES, device), weights)
    prefix = [11, 3, 57, 20, 8, 41]  # six tokens: one full page and half of the next

    # A computes the prefix, which is then published (the store takes its own page references).
    serving.start(100, list(prefix))
    identity = spec.derive_prefix_identity(7, 1, 2, 3, [])
    pages = tuple(page for page in serving.sched.page_table(100)[:2] if page is not None)
    serving.store.publish(spec.PrefixPageSet(identity, pages, len(prefix)), serving.pool)

    # B attaches the prefix: straight into DECODE, then prefills only its suffix, whose first
    # token lands on the shared half-page (copy-on-write).
    admission = serving.start(200, [*prefix, 30, 2, 17], identity)
    assert (admission.prefix_hit, admission.prefix_tokens) == (True, len(prefix))
    assert serving.copies == 1
    serving.round()  # A now writes its shared half-page too: a second copy
    assert serving.copies == 2
    serving.round()

    # C forks B, then takes a different next token: both write the same logical page next round.
    serving.sched.fork(200, 300, serving.pool)
    serving.sequences[300] = [*serving.sequences[200][:-1], 44]
    serving.sched.seed_decode_token(300, 44)
    copies = serving.copies
    serving.round()
    assert serving.copies == copies + 1  # one of B and C copies, the other then owns the page
    assert serving.sequences[300][:-2] == serving.sequences[200][:-2]
    assert serving.sequences[300][-2:] != serving.sequences[200][-2:]

    # A finishes; D reuses its slot and its freshly released (stale) pages.
    free_before = serving.pool.free_count()
    serving.sched.finish(100, serving.pool)
    assert serving.pool.free_count() > free_before
    d = serving.start(400, [9, 9, 1, 52, 33, 7, 18])
    assert d.slot == 0 and not d.prefix_hit
    for _ in range(3):
        serving.round()

    for finished in (200, 300, 400):
        serving.sched.finish(finished, serving.pool)
    assert serving.pool.free_count() == PHYSICAL_PAGES - len(pages)  # only the store holds pages now
    assert all(len(sequence) > 9 for sequence in serving.sequences.values())
