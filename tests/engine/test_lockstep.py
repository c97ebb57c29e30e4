"""impl's engine in lockstep with the spec's, every check after every event, over each shape
(ten: six with the automatic prefix cache, three of those with a host tier whose copies end late,
out of order or failed, or fail to start; one roomy enough that decode and prefill share a
step's budget); and the spec's engine alone (its own checks: invariants, ghost reads, cached
content on both tiers, tenant isolation, determinism, order, liveness), without the cache, with
it, and with a host tier."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvsched.testing.engine_machine import SHAPES, engine_machine, spec_engine


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_impl_engine_refines_the_spec(shape: str) -> None:
    machine = engine_machine(config=SHAPES[shape])
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()


@pytest.mark.parametrize("shape", ["default", "cached", "host"])
def test_the_spec_engine_alone_passes_every_check(shape: str) -> None:
    machine = engine_machine(factory=spec_engine, reference=None, config=SHAPES[shape])
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
