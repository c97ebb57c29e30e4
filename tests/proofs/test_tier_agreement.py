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

from kvsched.proofs import tier_safety
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec.tiers import Tier, TierState
from kvsched.testing.components.tiers import TierConfig, spec_tiers
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
