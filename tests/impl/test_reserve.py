"""impl's evictable reserve in lockstep with the spec's (`kvsched.spec.reserve`), by its registration.

The reserve is a registered component (`kvsched.testing.registry.RESERVE`): the machine base
draws every event of its alphabet, in range and out of it (out-of-range and reserved pages,
double frees, registering free pages, resetting while pages are held), and the one step checker
checks each call (lockstep, atomicity of a refusal, the read-only lookup, the invariants); the
explorer checks every state of a small reserve the same way. The wrong reserves `make vllm`
uses must each be told apart from the spec by both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.vllm.variants import VARIANTS
from kvsched.impl.reserve import Reserve as ImplReserve
from kvsched.proofs import component_explorer
from kvsched.proofs.component_explorer import ComponentExplorer
from kvsched.spec import reserve as spec
from kvsched.spec.errors import DoubleRelease, Exhausted, InvalidBlock
from kvsched.testing.bounded import bounded
from kvsched.testing.checks import CheckFailed, FailureKind
from kvsched.testing.component_machine import machine_for
from kvsched.testing.components.reserve import ReserveConfig, impl_reserve, spec_reserve
from kvsched.testing.registry import RESERVE

EXPLORED = ReserveConfig(pages=3, keys=("a", "b"))  # 650 states, every one checked
CALLS: Counter[str] = Counter()  # calls made and refused, over every example of a run


def wrong(name: str) -> Any:
    """A factory of the wrong reserve `name`."""
    return lambda config: VARIANTS[name](config.pages, caching=config.caching)


def run_lockstep(factory: Any, config: ReserveConfig, examples: int = 300, shrink: bool = True) -> None:
    machine = machine_for(RESERVE, factory, spec_reserve, config, tally=CALLS)
    machine.TestCase.settings = bounded(examples, 40, shrink=shrink)
    machine.TestCase().runTest()


@pytest.mark.parametrize("caching", [True, False])
def test_impl_reserve_refines_the_spec(caching: bool) -> None:
    CALLS.clear()
    run_lockstep(impl_reserve, ReserveConfig(caching=caching), examples=150)  # the explorer below is exhaustive
    assert CALLS["made"] > CALLS["refused"] > 0  # bad input reached both, and so did good


@pytest.mark.parametrize("caching", [True, False])
def test_every_state_of_a_small_reserve_refines_the_spec(caching: bool) -> None:
    config = ReserveConfig(pages=EXPLORED.pages, keys=EXPLORED.keys, caching=caching)
    result = ComponentExplorer(RESERVE, config, impl_reserve, spec_reserve).run()
    assert result.complete and result.violation is None, result.violation
    assert result.states == 650 and result.transitions == 27_950


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_wrong_reserve_is_told_apart_by_the_machine(name: str) -> None:
    with pytest.raises(CheckFailed) as caught:
        run_lockstep(wrong(name), ReserveConfig(), examples=2000, shrink=False)
    assert caught.value.failure.kind is FailureKind.LOCKSTEP


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_wrong_reserve_is_told_apart_by_the_explorer(name: str) -> None:
    violation = ComponentExplorer(RESERVE, EXPLORED, wrong(name), spec_reserve).run().violation
    assert violation is not None and violation.kind is FailureKind.LOCKSTEP, violation


def test_the_transitions_by_hand() -> None:
    """vLLM's order, spelled out: fresh pages 1, 2, 3; an uncached free goes to the front, a
    cached one is parked at the back and evicted last; a hit revives a parked page."""
    reserve = spec.Reserve(5)
    assert reserve.allocate(3) == (1, 2, 3)
    reserve.register("k", 2)
    freed = reserve.free([3, 2, 1])  # a request frees its pages tail first
    assert freed == spec.Freed(front=(3, 1), back=(2,))
    assert reserve.state.queue == (3, 1, 4, 2)
    assert reserve.lookup("k") == 2
    reserve.touch([2])  # the hit
    assert list(reserve.state.queue) == [3, 1, 4] and reserve.ref_count(2) == 1
    reserve.free([2])
    assert reserve.allocate(4) == (3, 1, 4, 2)  # the parked page last, and its key is gone
    assert reserve.lookup("k") is None
    with pytest.raises(Exhausted):
        reserve.allocate(1)
    with pytest.raises(InvalidBlock):
        reserve.register("k", 0)  # the reserved page never enters the cache


def test_freeing_to_the_eviction_end_by_hand() -> None:
    """vLLM 0.34's `evict_first`: a cached page whose content another tier holds goes to the
    front, keys kept (a hit still revives it), and is evicted before every parked page."""
    reserve = spec.Reserve(5)
    assert reserve.allocate(4) == (1, 2, 3, 4)
    for key, page in (("a", 1), ("b", 2), ("c", 3)):
        reserve.register(key, page)
    reserve.free([1])  # parked
    freed = reserve.free_evict_first([2, 4, 3])
    assert freed == spec.Freed(front=(2, 4, 3), back=())
    assert reserve.state.queue == (2, 4, 3, 1)
    assert reserve.lookup("b") == 2 and reserve.lookup("c") == 3
    assert reserve.touch([3]) == (3,)  # a hit before it is taken revives it
    reserve.free_evict_first([3])
    assert reserve.allocate(2) == (3, 2)  # the newest freed to the front is taken first
    assert reserve.lookup("b") is None and reserve.lookup("c") is None and reserve.lookup("a") == 1
    with pytest.raises(DoubleRelease):
        reserve.free_evict_first([2, 2, 2])  # a double free, refused whole
    assert list(reserve.state.queue) == [4, 1] and reserve.ref_count(2) == 1


@pytest.mark.parametrize("reserve_class", [spec.Reserve, ImplReserve])
def test_a_key_on_several_pages_and_a_page_under_several_keys(reserve_class: Any) -> None:
    """The index both ways: a key's hit is its first registered page, and the next registered
    when that one goes; a page's keys come back oldest first; the spec's order of all of them is
    the order they were made."""
    reserve = reserve_class(6)
    assert reserve.allocate(4) == (1, 2, 3, 4)
    for key, page in (("k", 2), ("k", 3), ("p", 3), ("k", 1), ("q", 3), ("k", 3)):
        reserve.register(key, page)  # the last is made already: nothing changes
    assert reserve.lookup("k") == 2
    assert spec.keys_of(reserve.to_spec(), 3) == ("k", "p", "q")
    assert reserve.forget(2) == ("k",)
    assert reserve.lookup("k") == 3  # the next registered
    assert reserve.to_spec().entries == (("k", 3), ("p", 3), ("k", 1), ("q", 3))
    assert reserve.forget(3) == ("k", "p", "q")
    assert reserve.lookup("k") == 1 and reserve.lookup("p") is None
    reserve.free([1])  # cached: parked behind the never-used page 5
    assert reserve.allocate(2) == (5, 1)  # the parked page last: its key evicted with it
    assert reserve.lookup("k") is None and not reserve.is_cached(1)


def test_publication_waits_for_the_lookahead_tokens() -> None:
    """A page is published once the tokens its key covers past it exist: at 32 tokens two pages
    of 16 without lookahead, one with a token of lookahead, both at 33."""
    assert spec.publishable(2, 16, 32)
    assert not spec.publishable(2, 16, 32, lookahead=1)
    assert spec.publishable(1, 16, 32, lookahead=1)
    assert spec.publishable(2, 16, 33, lookahead=1)
    assert not spec.publishable(1, 16, 15) and spec.publishable(0, 16, 0)


@given(st.integers(1, 40), st.integers(0, 40))
def test_allocation_never_hands_out_a_reserved_page(pages_: int, n: int) -> None:
    reserve = ImplReserve(pages_)
    if n <= pages_ - 1:
        assert 0 not in reserve.allocate(n)


@pytest.mark.proof
def test_the_proofs_explore_the_reserve_and_fail_on_a_wrong_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m kvsched.proofs.component_explorer` (in `make proofs`) searches the reserve's CI
    configurations, impl against the spec, and exits 1 when impl is a wrong reserve."""
    assert component_explorer.main([]) == 0
    wrong_reserve = replace(RESERVE, impl=wrong("NewestFirst"))
    monkeypatch.setattr(component_explorer, "COMPONENTS", (wrong_reserve,))
    assert component_explorer.main([]) == 1
