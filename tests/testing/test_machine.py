"""The stateful machine over the spec itself: every operation, every invariant, every step."""

from __future__ import annotations

from pathlib import Path

from hypothesis import settings

from kvsched import testing
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


def test_the_public_api_checks_a_user_system() -> None:
    """What a user imports from `kvsched.testing` runs the lockstep machine on an adapter."""
    stats = testing.CampaignStats()
    config = testing.SystemConfig()
    testing.run_machine(
        lambda: testing.KvschedMachine(testing.impl_system, testing.spec_system, config, stats),
        settings(max_examples=5, stateful_step_count=20, deadline=None, database=None, derandomize=True),
    )
    assert stats.examples >= 5 and stats.steps > 0 and stats.invariant_checks > 0
    assert not hasattr(testing, "Explorer")  # the explorer is kvsched.proofs': testing never imports it


def test_the_documented_example_of_one_checked_event_runs() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "checked.md").read_text()
    start = readme.index("The same events drive your system")
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    exec(compile(block[: block.index("```")], "docs/checked.md", "exec"), {})
