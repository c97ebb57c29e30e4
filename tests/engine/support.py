"""Shared pieces of the engine tests: both flavours, a request's greedy tokens under the null
model, and running an engine until it has no work."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.engine_state import check_engine_invariants
from kvsched.spec.model import NULL_VOCAB, null_next_token
from kvsched.spec.sequence import FinishReason
from kvsched.testing.bounded import bounded

# The engine machine's bounded search (examples and steps, derandomized: never a clock).
SEARCH = bounded(300, 40)
FLAVOURS = [pytest.param(spec, id="spec"), pytest.param(impl, id="impl")]
# Room for every request of a test at once; tests narrow it with `replace`.
SMALL = EngineConfig(
    requests=4,
    pages=8,
    page_size=2,
    logical_pages=8,
    max_batch_size=4,
    max_batched_tokens=8,
    chunk_size=4,
    prefill_reserve_pages=0,
    max_queue=4,
    max_seq_len=16,
)


def greedy(prompt: tuple[int, ...], max_new_tokens: int, eos: int | None = None, vocab: int = NULL_VOCAB) -> list[int]:
    """The null model's tokens for a request run alone and densely."""
    sequence, tokens = list(prompt), []
    for _ in range(max_new_tokens):
        token = null_next_token(sequence[-1], len(sequence) - 1, vocab)
        tokens.append(token)
        sequence.append(token)
        if token == eos:
            break
    return tokens


def run_to_completion(engine: Any, limit: int = 10_000) -> tuple[dict[int, list[int]], dict[int, FinishReason]]:
    """Step until no work is left (at most `limit` steps), checking the engine invariants after
    each; every request's streamed tokens and how each finished."""
    tokens: dict[int, list[int]] = {}
    finished: dict[int, FinishReason] = {}
    for _ in range(limit):
        if not engine.has_work():
            return tokens, finished
        output = engine.step()
        for request_id, new in output.tokens.items():
            tokens.setdefault(request_id, []).extend(new)
        finished.update(output.finished)
        violated = check_engine_invariants(engine.to_spec())
        assert not violated, violated
    raise AssertionError(f"still working after {limit} steps")
