"""The machine can fail: each deliberately broken spec variant is caught, by the spec-level
checks alone (no reference beside it) and in lockstep with the spec."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvsched.testing.machine import KvschedMachine
from kvsched.testing.system import SystemConfig, spec_system
from kvsched.testing.variants import VARIANTS

HUNT = settings(
    max_examples=1500,
    stateful_step_count=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


@pytest.mark.parametrize("lockstep", [False, True], ids=["checks-alone", "lockstep"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_broken_variant_is_caught(name: str, lockstep: bool) -> None:
    factory = VARIANTS[name]
    reference = spec_system if lockstep else None
    config = SystemConfig(max_references=3)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(lambda: KvschedMachine(factory, reference, config), settings=HUNT)
