"""The machine can fail: each deliberately broken spec variant is caught by the spec-level checks
alone (invariants, atomicity, postconditions, ghost reads, LIFO order, liveness), with no
reference implementation beside it. The impl mutant corpus covers lockstep divergence."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from kvsched.testing.campaign import run_machine
from kvsched.testing.checks import CheckFailed, FailureKind
from kvsched.testing.machine import KvschedMachine
from kvsched.testing.system import SystemConfig
from kvsched.testing.variants import VARIANTS

HUNT = settings(
    max_examples=3000,
    stateful_step_count=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
    phases=[Phase.generate],  # the first failing program is the verdict; shrinking it took minutes
)

EXPECTED = {
    "finish leaks one page": (FailureKind.INVARIANT, "inv_refcount_equals_owners"),
    "install_shared_prefix without rollback": (FailureKind.ATOMICITY, ""),
    "outputs applied before the identity check": (FailureKind.ATOMICITY, ""),
    "pages reused first-in-first-out": (FailureKind.LIFO, ""),
    "a round that writes shared pages": (FailureKind.EXCLUSIVE, ""),
    "finish in another pool": (FailureKind.INVARIANT, "inv_refcount_equals_owners"),
    "a round on buffers that share memory": (FailureKind.ATOMICITY, ""),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_broken_variant_is_caught(name: str) -> None:
    factory = VARIANTS[name]
    config = SystemConfig(max_references=3)
    with pytest.raises(CheckFailed) as caught:
        run_machine(lambda: KvschedMachine(factory, None, config), HUNT)
    kind, detail = EXPECTED[name]
    assert caught.value.failure.kind is kind and detail in caught.value.failure.detail


def test_every_variant_has_an_expected_failure() -> None:
    assert set(EXPECTED) == set(VARIANTS)
