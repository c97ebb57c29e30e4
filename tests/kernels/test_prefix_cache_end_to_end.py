"""The automatic prefix cache serving the real paged model: greedy tokens are identical with the
cache on and off (and equal a dense run of each request alone) for a shared system prompt, a
multi-turn conversation whose second turn reuses the first turn's generated pages, and two
tenants with the same prompt, who must not share a page; under memory pressure the cache evicts
and still serves the same tokens. On numpy (spec) and cpu (impl)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.kernels import ModelConfig, PagedBackend, init_weights
from kvsched.kernels.model import greedy_reference
from kvsched.spec import EngineConfig, EngineRequest
from kvsched.spec.prefix_cache import CacheStats

PAGE_SIZE = 4
SYSTEM = (11, 3, 57, 20, 8, 41, 9, 30, 2, 17, 44, 6)  # three full pages
CONFIG = EngineConfig(
    requests=4,
    pages=24,
    page_size=PAGE_SIZE,
    logical_pages=8,
    max_batch_size=4,
    max_batched_tokens=12,
    chunk_size=8,
    prefill_reserve_pages=2,
    max_queue=16,
    max_seq_len=32,
)
FLAVOURS = [pytest.param(spec, "numpy", id="spec-numpy"), pytest.param(impl, "cpu", id="impl-cpu")]
WEIGHTS = init_weights(ModelConfig(q_heads=4, kv_heads=1, page_size=PAGE_SIZE, cache_dtype="float32"), seed=7)


def sum_stats(total: CacheStats, step: CacheStats) -> CacheStats:
    return CacheStats(*(a + b for a, b in zip(_fields(total), _fields(step), strict=True)))


def _fields(stats: CacheStats) -> tuple[int, ...]:
    return (stats.queries, stats.query_tokens, stats.hits, stats.hit_tokens, stats.evictions)


class Served:
    """An engine over the paged model: submit in waves, step to completion, keep every token."""

    def __init__(self, flavour: Any, device: str, config: EngineConfig) -> None:
        self.engine = flavour.Engine(config, PagedBackend(WEIGHTS, config.pages, device))
        self.tokens: dict[int, list[int]] = {}
        self.stats = CacheStats()
        self.shared: set[tuple[int, int]] = set()  # (tenant, tenant) pairs that held one page at once

    def run(self, *requests: EngineRequest) -> None:
        for request in requests:
            self.engine.submit(request)
        tenants = {request.request_id: request.tenant for request in requests}
        while self.engine.has_work():
            output = self.engine.step()
            self.stats = sum_stats(self.stats, output.cache)
            for request_id, new in output.tokens.items():
                self.tokens.setdefault(request_id, []).extend(new)
            self._note_sharing(tenants)

    def _note_sharing(self, tenants: dict[int, int]) -> None:
        holders: dict[int, set[int]] = {}
        for slot in self.engine.to_spec().system.scheduler.slots:
            if slot.request_id in tenants:
                for page in slot.table:
                    if page is not None:
                        holders.setdefault(page, set()).add(tenants[slot.request_id])
        self.shared |= {(min(t), max(t)) for t in holders.values() if len(t) > 1}


def both_ways(flavour: Any, device: str, config: EngineConfig, *waves: list[EngineRequest]) -> tuple[Served, Served]:
    """The same waves served with the cache on and off."""
    served = []
    for caching in (True, False):
        run = Served(flavour, device, replace(config, prefix_caching=caching))
        for wave in waves:
            run.run(*wave)
        served.append(run)
    return served[0], served[1]


def dense(request: EngineRequest) -> list[int]:
    return greedy_reference(WEIGHTS, request.prompt, request.max_new_tokens)[0]


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_a_shared_system_prompt_hits_and_serves_the_same_tokens(flavour: Any, device: str) -> None:
    first = [EngineRequest(1, (*SYSTEM, 5, 9), 4)]
    rest = [EngineRequest(2 + index, (*SYSTEM, *tail), 4) for index, tail in enumerate([(1,), (7, 7, 3), (60, 2)])]
    on, off = both_ways(flavour, device, CONFIG, first, rest)
    assert on.tokens == off.tokens
    assert all(on.tokens[request.request_id] == dense(request) for request in first + rest)
    assert on.stats.hits == 3 and on.stats.hit_tokens == 3 * len(SYSTEM)  # every later request: 3 pages
    assert off.stats == CacheStats()


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_a_second_turn_reuses_the_first_turns_generated_pages(flavour: Any, device: str) -> None:
    turn_one = EngineRequest(1, SYSTEM[:6], 11)
    on, off = both_ways(flavour, device, CONFIG, [turn_one])
    reply = on.tokens[1]
    turn_two = EngineRequest(2, (*SYSTEM[:6], *reply, 33, 4), 4)  # the conversation so far, then the user
    for served in (on, off):
        served.run(turn_two)
    assert on.tokens == off.tokens and on.tokens[2] == dense(turn_two)
    # The first turn wrote KV at positions 0..15 (its last token has none): 4 full pages, the last
    # two of generated tokens; turn two hits all 4.
    assert on.stats.hit_tokens == 16


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_two_tenants_with_one_prompt_share_no_page(flavour: Any, device: str) -> None:
    prompt = (*SYSTEM, 1, 2)
    wave = [EngineRequest(1, prompt, 3, tenant=0), EngineRequest(2, prompt, 3, tenant=1)]
    later = [EngineRequest(3, prompt, 3, tenant=1), EngineRequest(4, prompt, 3, tenant=0)]
    on, off = both_ways(flavour, device, CONFIG, wave, later)
    assert on.tokens == off.tokens and all(tokens == dense(wave[0]) for tokens in on.tokens.values())
    assert (0, 1) not in on.shared  # no page was ever held by both tenants
    assert on.stats.hits == 2  # each tenant's later request hit its own tenant's pages


@pytest.mark.parametrize(("flavour", "device"), FLAVOURS)
def test_under_memory_pressure_the_cache_evicts_and_serves_the_same_tokens(flavour: Any, device: str) -> None:
    config = replace(CONFIG, pages=12)
    waves = [
        [EngineRequest(10 * wave + index, (*SYSTEM[: 4 * wave + 4], index, wave), 5) for index in range(3)]
        for wave in range(3)
    ]
    on, off = both_ways(flavour, device, config, *waves)
    assert on.tokens == off.tokens
    assert all(on.tokens[request.request_id] == dense(request) for wave in waves for request in wave)
    assert on.stats.evictions > 0 and on.stats.hits > 0
