"""Regression tests named after the upstream bugs the engine is built against: each scenario
passes on the spec's and impl's engines and fails on the broken engine that has the bug."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kvsched import impl, spec
from kvsched.spec import EngineConfig, EngineRequest, KvschedError
from kvsched.testing.engine_variants import ENGINE_VARIANTS
from tests.engine.support import SMALL, greedy, run_to_completion

CONFIG = replace(SMALL, pages=5, max_batch_size=2, prefix_entries=1, admission="first_chunk")  # pressure
Factory = Callable[[EngineConfig, Any], Any]


def spec_engine(config: EngineConfig, model: Any) -> Any:
    return spec.Engine(config, model)


def impl_engine(config: EngineConfig, model: Any) -> Any:
    return impl.Engine(config, model)


def vllm_39734(factory: Factory) -> None:
    """A request larger than the cache must be refused, not queued to block the rest forever."""
    engine = factory(CONFIG, impl.NullModel(50))
    with contextlib.suppress(spec.RequestTooLarge):  # refused at the door, or it must not block
        engine.submit(EngineRequest(1, (3,) * 8, 6))  # 14 tokens: 7 pages of a 5-page pool
    engine.submit(EngineRequest(2, (3, 4), 3))
    tokens, _ = run_to_completion(engine, limit=100)
    assert tokens[2] == greedy((3, 4), 3, vocab=50)


def vllm_45388(factory: Factory) -> None:
    """KV pressure must preempt, never deadlock: two requests that cannot both fit both finish."""
    engine = factory(CONFIG, impl.NullModel(50))
    engine.submit(EngineRequest(1, (1, 2, 3), 6))
    engine.submit(EngineRequest(2, (4, 5, 6), 6))
    tokens, _ = run_to_completion(engine, limit=100)
    assert tokens[1] == greedy((1, 2, 3), 6, vocab=50) and tokens[2] == greedy((4, 5, 6), 6, vocab=50)


def vllm_41951(factory: Factory) -> None:
    """A preempted request is readmitted before any later arrival of its priority."""
    engine = factory(CONFIG, impl.NullModel(50))
    engine.submit(EngineRequest(1, (1, 2, 3), 6))
    engine.submit(EngineRequest(2, (4, 5, 6), 6))
    engine.step()
    engine.submit(EngineRequest(3, (7,), 2))  # later, and waiting for a seat
    while not any(entry.request.request_id == 2 for entry in engine.to_spec().queue):
        engine.step()  # until request 2 is preempted
    queue = [entry.request.request_id for entry in engine.to_spec().queue]
    assert queue.index(2) < queue.index(3), queue


def nano_vllm_199(factory: Factory) -> None:
    """A full prefix hit still prefills its last prompt token and samples from its own logits."""
    engine = factory(CONFIG, impl.NullModel(50))
    prompt = (9, 8, 7, 6)
    engine.submit(EngineRequest(1, prompt, 2))
    engine.step()
    identity = spec.derive_prefix_identity(1, 2, 3, 4, [])
    engine.publish(1, len(prompt), identity)
    engine.submit(EngineRequest(2, prompt, 3, prefix=identity))
    tokens, _ = run_to_completion(engine, limit=100)
    assert tokens[2] == greedy(prompt, 3, vocab=50)


SCENARIOS = {
    "vllm_39734": (vllm_39734, "admit_too_large"),
    "vllm_45388": (vllm_45388, "never_preempt"),
    "vllm_41951": (vllm_41951, "preempt_to_back"),
    "nano_vllm_199": (nano_vllm_199, "full_hit_prefills_nothing"),
}


@pytest.mark.parametrize("bug", sorted(SCENARIOS))
@pytest.mark.parametrize("factory", [spec_engine, impl_engine], ids=["spec", "impl"])
def test_the_engine_does_not_have_the_upstream_bug(bug: str, factory: Factory) -> None:
    scenario, _ = SCENARIOS[bug]
    scenario(factory)


@pytest.mark.parametrize("bug", sorted(SCENARIOS))
def test_the_scenario_fails_on_an_engine_that_has_the_bug(bug: str) -> None:
    scenario, name = SCENARIOS[bug]
    variant = next(variant for variant in ENGINE_VARIANTS if variant.name == name)
    with pytest.raises((AssertionError, KvschedError)):
        scenario(variant.factory())


@pytest.mark.parametrize("flavour", [spec, impl], ids=["spec", "impl"])
@pytest.mark.parametrize("fixed", [True, False], ids=["as-built", "without-the-drop"])
def test_a_prefix_sharing_pages_with_the_last_request_is_dropped_not_the_request_forever(
    flavour: Any, fixed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the engine machine (whole-prompt admission, cached shape): a forked child publishes
    7 tokens whose last pages are its own copies, then is preempted. The parent, alone, cannot hold
    its whole sequence while the idle-but-shared entry keeps two pages, and preempting it (the last
    request) only readmits it to the same pages, forever. Removing the entry lets it finish."""
    from kvsched.impl.engine_cache import CachePolicy
    from kvsched.spec import engine_step as spec_step
    from kvsched.spec.identity import PrefixIdentity
    from kvsched.testing.engine_machine import SHAPES
    from kvsched.testing.engine_model import HarnessModel

    if not fixed and flavour is spec:  # the spec's cache part, as the spec's step imports it
        monkeypatch.setattr(spec_step, "drop_for_the_last", lambda work: False)
    elif not fixed:  # impl's cache part
        monkeypatch.setattr(CachePolicy, "drop_for_the_last", lambda self: False)
    config = SHAPES["whole_prompt_cached"]
    engine = flavour.Engine(config, HarnessModel(config.page_size))
    engine.submit(EngineRequest(1, (3, 1, 4, 1, 5, 9, 2, 6, 0, 0), 6))
    engine.step()
    engine.step()
    engine.fork(1, 0)
    engine.step()
    engine.step()
    engine.publish(0, 7, PrefixIdentity(words=(7, 68909, 268, 665)))
    steps = 0
    while engine.has_work() and steps < 200:
        engine.step()
        steps += 1
    assert (not engine.has_work()) == fixed
