"""impl's engine hashes each full page of a request once: a prompt's pages when it is submitted,
and a preempted request keeps its page keys for when it is admitted again; it still gets exactly
the spec's cache and tokens."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from kvsched import impl, spec
from kvsched.impl.engine_admission import Admission
from kvsched.spec import EngineRequest
from kvsched.spec.engine_config import EngineConfig
from kvsched.spec.engine_state import Queued
from kvsched.spec.model import EngineModel
from kvsched.spec.page_keys import Key, pack_tokens, register_page_hash
from tests.engine.support import SMALL

HASHED: list[bytes] = []


def counted_sha256(data: bytes) -> bytes:
    """SHA-256, each input recorded."""
    HASHED.append(bytes(data))
    return hashlib.sha256(data).digest()


register_page_hash("counted_sha256", counted_sha256)
CONFIG = replace(
    SMALL, pages=10, prefix_caching=True, page_hash="counted_sha256", admission="first_chunk", chunk_size=2
)
PROMPTS = {1: (1, 2, 3, 4, 5, 6), 2: (7, 8, 9, 10, 11, 12), 3: (13, 14, 15, 16, 17, 18)}


class RehashingAdmission(Admission):
    """An admission that forgets a preempted request's keys (hashes them again)."""

    __slots__ = ()

    def _keys_of(self, entry: Queued, pages: int) -> list[Key]:
        request = entry.request
        data = request.prompt_bytes + pack_tokens(entry.generated)
        return self.keys.hasher.keys_of(data, pages, self.keys.salt(request))


class RehashingEngine(impl.Engine):
    """impl's engine whose admission forgets a preempted request's keys."""

    def __init__(self, config: EngineConfig, model: EngineModel) -> None:
        super().__init__(config, model)
        self.admission.__class__ = RehashingAdmission


class AdmissionHashingEngine(impl.Engine):
    """impl's engine whose submit only queues a request (its intake checks aside): the prompt is
    hashed when it is admitted."""

    def submit(self, request: EngineRequest) -> None:
        self.queue.push(Queued(request), front=False)


def hashed_at_submit(engine: Any) -> tuple[int, list[bytes]]:
    """One 6-token request (3 full pages): the inputs hashed by its submit, and by its first step."""
    HASHED.clear()
    engine.submit(EngineRequest(1, PROMPTS[1], 6))
    at_submit = len(HASHED)
    engine.step()
    return at_submit, HASHED[at_submit:]


def test_a_prompt_is_hashed_when_it_is_submitted() -> None:
    at_submit, by_the_step = hashed_at_submit(impl.Engine(CONFIG, impl.NullModel()))
    assert at_submit == 1 + 3  # the salt's root, then each full page
    assert by_the_step == []  # its admission and its first chunk reuse them


def test_the_check_fails_an_engine_that_hashes_at_admission() -> None:
    at_submit, by_the_step = hashed_at_submit(AdmissionHashingEngine(CONFIG, impl.NullModel()))
    assert (at_submit, len(by_the_step)) == (0, 4)


def run(engine: Any) -> tuple[dict[int, list[int]], int, list[bytes]]:
    """Three requests under pressure: their tokens, how many preemptions, the pages hashed."""
    HASHED.clear()
    for request_id, prompt in PROMPTS.items():
        engine.submit(EngineRequest(request_id, prompt, 6))
    preempted = 0
    tokens: dict[int, list[int]] = {}
    while engine.has_work():
        output = engine.step()
        preempted += len(output.preempted)
        for request_id, new in output.tokens.items():
            tokens.setdefault(request_id, []).extend(new)
    return tokens, preempted, list(HASHED)


def test_a_preempted_request_is_not_hashed_again() -> None:
    tokens, preempted, hashed = run(impl.Engine(CONFIG, impl.NullModel()))
    assert preempted >= 2
    assert len(hashed) == len(set(hashed))  # no page (nor the root) hashed twice
    spec_tokens, spec_preempted, _ = run(spec.Engine(CONFIG, spec.NullModel()))
    assert (tokens, preempted) == (spec_tokens, spec_preempted)


def test_the_check_fails_an_engine_that_hashes_again() -> None:
    _, preempted, hashed = run(RehashingEngine(CONFIG, impl.NullModel()))
    assert preempted >= 2
    assert len(hashed) > len(set(hashed))


def test_the_same_cache_as_the_spec_after_preemptions() -> None:
    engine = impl.Engine(CONFIG, impl.NullModel())
    reference = spec.Engine(CONFIG, spec.NullModel())
    for request_id, prompt in PROMPTS.items():
        engine.submit(EngineRequest(request_id, prompt, 6))
        reference.submit(EngineRequest(request_id, prompt, 6))
    while reference.has_work():
        assert engine.step() == reference.step()
        assert engine.to_spec() == reference.state
    assert not engine.has_work()
