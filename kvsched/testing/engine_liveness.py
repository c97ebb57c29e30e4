"""Liveness of an engine: with no arrivals, stepping finishes every request within a bound.

`drained(engine, bound, tier)` steps a copy's worth of engine (the caller's: it is changed) with a
well-behaved model until it has no work, and then checks that only published prefixes and the
prefix cache hold pages and no state slot is held. `tier` says how the host tier behaves while
it drains (`kvsched.testing.engine_model`): working, every copy failing, or one bad host page.
A host tier that fails must cost the engine its cached pages, never its progress: an engine that
demotes a page again and again, or hands a failed host page straight back, never finishes.
"""

from __future__ import annotations

from typing import Any

from kvsched.spec import events as ev
from kvsched.spec.prefix import get_store_references
from kvsched.spec.prefix_cache import get_cache_references
from kvsched.testing.engine_model import BAD_PAGE, FAILING, WORKING
from kvsched.testing.outcome import CheckFailure, FailureKind, capture

TIER_FAULTS = (FAILING, BAD_PAGE)  # the failing tiers a hosted engine must drain under


def drained(engine: Any, bound: int, tier: str = WORKING) -> CheckFailure | None:
    """Liveness from the engine's state (see the module docstring)."""
    under = "" if tier == WORKING else f" under a {tier} host tier"
    model = engine.model
    if hasattr(model, "arm"):
        model.arm(ev.Step())  # every copy in flight completes (or fails, as `tier` says)
        model.tier = tier
    for _ in range(bound):
        if not engine.has_work():
            break
        outcome = capture(engine.step)
        if outcome.error is not None:
            return CheckFailure(FailureKind.LIVENESS, f"draining{under}: a step raised {outcome.summary()}")
    if engine.has_work():
        return CheckFailure(FailureKind.LIVENESS, f"work left after {bound} steps with no arrivals{under}")
    state = engine.to_spec()
    pool, store = state.system.pool, state.system.store
    cached = get_cache_references(state.system.cache)
    held = [
        page for page, count in enumerate(pool.refs) if count != get_store_references(store, page) + cached.get(page, 0)
    ]
    if held or any(owner is not None for owner in state.state_slots):
        return CheckFailure(FailureKind.LIVENESS, f"pages {held} or a state slot still held after draining{under}")
    return None
