"""The tiered cache's z3 invariant tied to the spec's: on every reachable state of a small tiered
cache and on corrupted ones, the model's invariant holds exactly when the spec invariants it
carries do (every count is its holders; each free stack is exactly the unheld pages).

The states come from the tiers' explorer (by its registration); each is corrupted in the ways the
carried invariants forbid and the upstream bugs produce: a lease dropped from the count, a page
counted once more, a held page on the free stack, a free page off it, a host page reclaimed while
a copy holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from kvsched import spec
from kvsched.proofs import tier_safety
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.proofs.engine_explorer import HOSTED, EngineExplorer
from kvsched.spec import EngineRequest
from kvsched.spec.engine_state import EngineState, inv_engine_is_a_tiered_cache
from kvsched.spec.engine_tiers import as_tiers
from kvsched.spec.tiers import Tier, TierState
from kvsched.testing.components.tiers import TierConfig, spec_tiers
from kvsched.testing.engine_machine import spec_engine
from kvsched.testing.engine_model import HarnessModel
from kvsched.testing.registry import TIERS

CONFIG = TierConfig(device_pages=2, host_pages=1, chains=(("a",),), requests=2)


def reachable() -> list[TierState]:
    explorer = ComponentExplorer(TIERS, CONFIG, spec_tiers)
    result = explorer.run()
    assert result.complete and result.violation is None
    return explorer.states


def carried(state: TierState) -> bool:
    return all(invariant(state) for invariant in tier_safety.CARRIED)


def _count(tier: Tier, page: int, by: int) -> Tier:
    refs = list(tier.refs)
    refs[page] += by
    return replace(tier, refs=tuple(refs))


CORRUPTIONS: dict[str, Callable[[TierState], Iterator[TierState]]] = {
    "a lease dropped from its page's count": lambda s: (
        replace(s, device=_count(s.device, lease.page, -1)) for lease in s.leases[:1]
    ),
    "a device page counted once more": lambda s: (
        replace(s, device=_count(s.device, page, 1)) for page, n in enumerate(s.device.refs) if n
    ),
    "a held device page on the free stack": lambda s: (
        replace(s, device=replace(s.device, free=(*s.device.free, page))) for page, n in enumerate(s.device.refs) if n
    ),
    "a free device page off the free stack": lambda s: (
        replace(s, device=replace(s.device, free=s.device.free[1:])) for _ in s.device.free[:1]
    ),
    "a host page reclaimed under a copy": lambda s: (
        replace(
            s, host=replace(_count(s.host, t.host_page, -s.host.refs[t.host_page]), free=(*s.host.free, t.host_page))
        )
        for t in s.transfers[:1]
    ),
}


def test_the_model_agrees_on_every_reachable_state() -> None:
    states = reachable()
    assert len(states) == 682
    assert all(tier_safety.holds(state) and carried(state) for state in states)


def test_the_model_rejects_every_corruption() -> None:
    states = reachable()
    for name, corrupt in CORRUPTIONS.items():
        corrupted = [bad for state in states for bad in corrupt(state)][:40]
        assert corrupted, f"no reachable state to corrupt with {name!r}"
        for state in corrupted:
            assert not carried(state), (name, state)  # the spec sees it...
            assert not tier_safety.holds(state), (name, state)  # ...and the model sees it


# -- the engine as a tiered cache ---------------------------------------------------------------


def engine_states() -> list[EngineState]:
    """The hosted engine explorer's first states (copies in flight among them), and an engine's
    states around a lease (held through its request's finish)."""
    explorer = EngineExplorer(replace(HOSTED, max_states=500), spec_engine)
    assert explorer.run().violation is None
    states: list[EngineState] = list(explorer.states)
    engine = spec.Engine(HOSTED.config, HarnessModel(HOSTED.config.page_size))
    engine.submit(EngineRequest(1, (3, 1, 4, 1, 5), 3))
    engine.step()
    lease = engine.lease(1)
    states.append(engine.to_spec())
    while engine.has_work():
        engine.step()
        states.append(engine.to_spec())
    engine.end_lease(lease)
    states.append(engine.to_spec())
    assert any(state.host.copies for state in states) and any(state.leases for state in states)
    return states


def tiers_of(state: EngineState) -> TierState:
    return as_tiers(state.system, state.host, [lease.pages for lease in state.leases])


def _pool_count(state: EngineState, page: int, by: int) -> EngineState:
    pool = state.system.pool
    refs = list(pool.refs)
    refs[page] += by
    return replace(state, system=replace(state.system, pool=replace(pool, refs=tuple(refs))))


ENGINE_CORRUPTIONS: dict[str, Callable[[EngineState], Iterator[EngineState]]] = {
    "a leased page's hold dropped (the lease-free reuse)": lambda s: (
        _pool_count(s, page, -1) for lease in s.leases[:1] for page in lease.pages[-1:]
    ),
    "a device page counted once more": lambda s: (
        _pool_count(s, page, 1) for page, n in enumerate(s.system.pool.refs) if n
    ),
    "a host page on the free stack under a copy": lambda s: (
        replace(s, host=replace(s.host, free=(*s.host.free, copy.host_page))) for copy in s.host.copies[-1:]
    ),
}


def test_every_engine_state_is_a_tiered_cache_state_the_model_accepts() -> None:
    """The tiers' z3 invariant (proved inductive at every size) holds on the engine's states,
    through the abstraction the engine's own invariant checks (`inv_engine_is_a_tiered_cache`)."""
    for state in engine_states():
        assert inv_engine_is_a_tiered_cache(state), state
        assert tier_safety.holds(tiers_of(state)), state


def test_a_corrupted_engine_state_is_rejected_by_the_invariant_and_the_model() -> None:
    states = engine_states()
    for name, corrupt in ENGINE_CORRUPTIONS.items():
        corrupted = [bad for state in states for bad in corrupt(state)][-20:]  # the last: leases, copies
        assert corrupted, f"no engine state to corrupt with {name!r}"
        for state in corrupted:
            assert not inv_engine_is_a_tiered_cache(state), (name, state)
            assert not tier_safety.holds(tiers_of(state)), (name, state)
