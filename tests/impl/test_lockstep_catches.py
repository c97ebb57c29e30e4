"""The machine in lockstep can fail: planted impl bugs are caught.

Each variant breaks one spec promise without breaking impl's own bookkeeping, so only the
comparison with the spec can notice (the kernel-level variants live in `kvsched.testing`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import Phase, settings

from kvsched.impl import pool as pool_module
from kvsched.impl import scheduler as scheduler_module
from kvsched.impl import slots as slots_module
from kvsched.spec.errors import Exhausted
from kvsched.testing.campaign import run_machine
from kvsched.testing.impl_system import impl_system
from kvsched.testing.machine import KvschedMachine
from kvsched.testing.system import spec_system

SEARCH = settings(max_examples=300, phases=[Phase.generate], database=None, derandomize=True, deadline=None)


def fifo_allocate(self: pool_module.BlockPool) -> int:
    """Hands out the bottom of the free stack: a consistent pool in the wrong order."""
    refs, free, top, _ = pool_module.get_arrays(self)
    count = int(top[0])
    if count == 0:
        raise Exhausted(f"no free page: all {refs.shape[0]} pages are held")
    page = int(free[0])
    free[: count - 1] = free[1:count].copy()
    top[0] = count - 1
    refs[page] = 1
    return page


def keep_token_count(slots: slots_module.SlotArrays, slot: int) -> None:
    """Clears a finished slot but its token count."""
    count = int(slots.token_counts[slot])
    slots_module.clear_slot(slots, slot)
    slots.token_counts[slot] = count


def unchecked_mark(self: scheduler_module.RequestScheduler, request_id: int) -> None:
    """Moves any live request to DECODE, as the original did."""
    slot = self._require_request(request_id)
    slots = scheduler_module.get_slots(self)
    if int(slots.states[slot]) == slots_module.PREFILL:
        self._decoding += 1
    slots.states[slot] = slots_module.DECODE


VARIANTS: dict[str, tuple[object, str, Callable[..., object]]] = {
    "pages handed out first-in-first-out": (pool_module.BlockPool, "allocate", fifo_allocate),
    "finish leaves the token count": (scheduler_module, "clear_slot", keep_token_count),
    "mark_prefill_complete from DECODE": (scheduler_module.RequestScheduler, "mark_prefill_complete", unchecked_mark),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_planted_bug_is_caught(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, name, replacement = VARIANTS[variant]
    monkeypatch.setattr(owner, name, replacement)
    with pytest.raises(AssertionError):
        run_machine(lambda: KvschedMachine(impl_system, spec_system), SEARCH)
