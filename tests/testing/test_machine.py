"""The stateful machine over the spec itself: every operation, every invariant, every step."""

from __future__ import annotations

from hypothesis import settings

from kvsched.testing.campaign import run_machine
from kvsched.testing.impl_system import impl_system
from kvsched.testing.machine import CampaignStats, KvschedMachine
from kvsched.testing.system import spec_system


def test_spec_satisfies_its_invariants_under_every_operation() -> None:
    stats = CampaignStats()
    run_machine(lambda: KvschedMachine(reference=None, stats=stats), settings())
    assert stats.examples > 0
    assert stats.steps > stats.examples  # the campaign really ran operations


def test_spec_in_lockstep_with_itself() -> None:
    """The harness itself is symmetric: two spec systems never diverge."""
    stats = CampaignStats()
    run_machine(lambda: KvschedMachine(spec_system, spec_system, stats=stats), settings(derandomize=True))
    assert stats.decoded_tokens > 0  # rounds really decoded (a fixed seed: a random dev run may decode none)


def test_impl_in_lockstep_with_the_spec() -> None:
    """`kvsched.impl` refines the spec: same results, errors and abstract states at every step."""
    stats = CampaignStats()
    run_machine(lambda: KvschedMachine(impl_system, spec_system, stats=stats), settings(derandomize=True))
    assert stats.decoded_tokens > 0
