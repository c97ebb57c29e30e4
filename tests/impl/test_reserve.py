"""impl's evictable reserve in lockstep with the spec's (`kvsched.spec.reserve`).

One machine drives both through every transition, with bad input beside good: out-of-range and
reserved pages, double frees, registering free pages, resetting while pages are held. After
every call the impl state must be the spec state, every reserve invariant must hold, and a
refused call must raise the same error and change nothing. The wrong reserves `make vllm`
uses must each be told apart from the spec.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from devtools.vllm.variants import VARIANTS
from kvsched.impl.reserve import Reserve as ImplReserve
from kvsched.spec import reserve as spec
from kvsched.spec.errors import Exhausted, InvalidBlock, KvschedError

PAGES = 6
pages = st.integers(-1, PAGES)
page_lists = st.lists(pages, max_size=5)
keys = st.sampled_from(["a", "b", "c", "d"])


CALLS: Counter[str] = Counter()  # calls made and refused, over every example of a run


class Divergence(AssertionError):
    """impl and spec disagree."""


class ReserveLockstep(RuleBasedStateMachine):
    impl_class: Callable[..., ImplReserve] = ImplReserve
    caching = True

    def __init__(self) -> None:
        super().__init__()
        self.spec = spec.Reserve(PAGES, caching=self.caching)
        self.impl = self.impl_class(PAGES, caching=self.caching)

    def _both(self, name: str, *args: object) -> object:
        before = self.spec.state
        try:
            expected = getattr(self.spec, name)(*args)
        except KvschedError as error:
            CALLS["refused"] += 1
            self._refused_alike(name, args, error, before)
            return None
        CALLS["made"] += 1
        got = getattr(self.impl, name)(*args)
        if got != expected:
            raise Divergence(f"{name}{args}: spec answered {expected!r}, impl {got!r}")
        return expected

    def _refused_alike(self, name: str, args: tuple[object, ...], error: KvschedError, before: object) -> None:
        try:
            getattr(self.impl, name)(*args)
        except KvschedError as got:
            if type(got) is not type(error) or got.details() != error.details():
                raise Divergence(f"{name}{args}: spec raised {error!r}, impl {got!r}") from got
        else:
            raise Divergence(f"{name}{args}: spec raised {error!r}, impl did not") from error
        if self.spec.state != before or self.impl.to_spec() != before:
            raise Divergence(f"{name}{args} was refused but changed the state")

    def _held(self) -> list[int]:
        return [page for page, count in enumerate(self.spec.state.refs) if count and page not in (0,)]

    @rule(n=st.integers(-1, PAGES + 1))
    def allocate(self, n: int) -> None:
        self._both("allocate", n)

    @rule(chosen=page_lists)
    def touch(self, chosen: list[int]) -> None:
        self._both("touch", chosen)

    @precondition(lambda self: self._held())
    @rule(data=st.data())
    def free_held(self, data: st.DataObject) -> None:
        held = self._held()
        chosen = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=len(held), unique=True))
        self._both("free", chosen)

    @rule(chosen=page_lists)
    def free_anything(self, chosen: list[int]) -> None:
        self._both("free", chosen)

    @rule(chosen=page_lists)
    def unpin(self, chosen: list[int]) -> None:
        self._both("unpin", chosen)

    @precondition(lambda self: self._held())
    @rule(key=keys, data=st.data())
    def register_held(self, key: str, data: st.DataObject) -> None:
        self._both("register", key, data.draw(st.sampled_from(self._held())))

    @rule(key=keys, page=pages)
    def register_anything(self, key: str, page: int) -> None:
        self._both("register", key, page)

    @rule(page=pages)
    def forget(self, page: int) -> None:
        self._both("forget", page)

    @rule()
    def reset(self) -> None:
        self._both("reset")

    @rule(key=keys)
    def lookup(self, key: str) -> None:
        self._both("lookup", key)

    @invariant()
    def same_state_and_invariants_hold(self) -> None:
        if self.impl.to_spec() != self.spec.state:
            raise Divergence(f"impl {self.impl.to_spec()} is not spec {self.spec.state}")
        broken = spec.check_reserve(self.spec.state)
        assert not broken, broken


LOCKSTEP = settings(max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))


def test_impl_reserve_refines_the_spec() -> None:
    CALLS.clear()
    ReserveLockstep.TestCase.settings = LOCKSTEP
    ReserveLockstep.TestCase().runTest()
    assert CALLS["made"] > CALLS["refused"] > 0  # bad input reached both, and so did good


def test_impl_reserve_refines_the_spec_with_caching_off() -> None:
    class Off(ReserveLockstep):
        caching = False

    Off.TestCase.settings = LOCKSTEP
    Off.TestCase().runTest()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_wrong_reserve_is_told_apart(name: str) -> None:
    class Wrong(ReserveLockstep):
        impl_class = VARIANTS[name]

    Wrong.TestCase.settings = settings(LOCKSTEP, max_examples=2000)
    with pytest.raises(Divergence):
        Wrong.TestCase().runTest()


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


@given(st.integers(1, 40), st.integers(0, 40))
def test_allocation_never_hands_out_a_reserved_page(pages_: int, n: int) -> None:
    reserve = ImplReserve(pages_)
    if n <= pages_ - 1:
        assert 0 not in reserve.allocate(n)
