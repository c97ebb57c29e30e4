"""impl's engine in lockstep with the spec's, every check after every event, over two shapes;
and the spec's engine alone (its own checks: invariants, ghost reads, determinism, order,
liveness)."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvsched.testing.engine_machine import SHAPES, engine_machine, spec_engine


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_impl_engine_refines_the_spec(shape: str) -> None:
    machine = engine_machine(config=SHAPES[shape])
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()


def test_the_spec_engine_alone_passes_every_check() -> None:
    machine = engine_machine(factory=spec_engine, reference=None)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
