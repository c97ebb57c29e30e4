"""impl in lockstep with the spec: the stateful machine (`kvsched.testing.machine`) over systems
of several shapes, keeping the ownership model and abusing it.

The machines are the main refinement check and cheap (a few ms per step), so each shape runs
the loaded profile's example count; the profile still decides (dev, ci, deep).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvsched.spec.batch import U32_MAX
from kvsched.testing.campaign import run_machine
from kvsched.testing.impl_system import impl_system
from kvsched.testing.machine import CampaignStats, KvschedMachine, OwnershipAbuse
from kvsched.testing.system import SystemConfig, spec_system

# The default shape, and the edges: no pages at all, one of everything with two references per
# page, and a wide system whose references never overflow.
SHAPES = {
    "default": SystemConfig(),
    "empty pool": SystemConfig(requests=1, logical_pages=1, physical_pages=0, store_entries=0, store_pages=1),
    "tight": SystemConfig(requests=2, logical_pages=2, physical_pages=3, store_entries=1, max_references=2),
    "wide": SystemConfig(
        requests=4, logical_pages=4, physical_pages=10, store_entries=3, store_pages=3, max_references=U32_MAX
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_impl_refines_the_spec(shape: str) -> None:
    stats = CampaignStats()
    config = SHAPES[shape]
    run_machine(lambda: KvschedMachine(impl_system, spec_system, config, stats), settings(deadline=None))
    assert stats.steps > stats.examples > 0


@pytest.mark.parametrize("shape", ["default", "tight"])
def test_impl_refines_the_spec_when_owners_are_robbed(shape: str) -> None:
    """Pages released behind their owners' backs: every rollback path still matches the spec."""
    stats = CampaignStats()
    config = SHAPES[shape]
    run_machine(lambda: OwnershipAbuse(impl_system, spec_system, config, stats), settings(deadline=None))
    assert stats.failed_operations > 0  # the robbed owners' releases really were refused
