"""The evictable reserve (`kvsched.spec.reserve`): its events as the machine draws them and the
explorer enumerates them, and its registration.

The machine draws arguments in range and out of it (pages from -1 to one past the end, keys from
a small set so registrations collide), and frees and registers held pages often enough that
parking, reviving and evicting all happen. The explorer tries every page alone and every held
pair in order (a free call's order decides where its pages go), and stops taking references
at `max_references` so the state space is finite.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

from kvsched.spec import reserve_events as rev
from kvsched.spec.reserve import RESERVE_INVARIANTS, Reserve, ReserveState
from kvsched.testing.component import QUERY, Component, Corpus, EventSpec, Harness

M, E, Z, C, S = Harness.MACHINE, Harness.EXPLORER, Harness.Z3, Harness.CONTRACTS, Harness.SAFETY


@dataclass(frozen=True, slots=True)
class ReserveConfig:
    """One reserve's size and what the harnesses draw from."""

    pages: int = 6
    caching: bool = True
    keys: tuple[str, ...] = ("a", "b", "c", "d")
    max_references: int = 2  # the explorer's budget per page


def spec_reserve(config: ReserveConfig) -> Reserve:
    """The spec's reserve."""
    return Reserve(config.pages, caching=config.caching)


def impl_reserve(config: ReserveConfig) -> Any:
    """impl's reserve."""
    from kvsched.impl.reserve import Reserve as ImplReserve

    return ImplReserve(config.pages, caching=config.caching)


def held(state: ReserveState) -> list[int]:
    """The pages some caller holds (the reserved ones apart)."""
    return [page for page, count in enumerate(state.refs) if count and page not in state.reserved]


# -- the machine's draws (each given the machine, whose `state()` is the system's) ------------


# Strategies are built once per configuration and set of held pages (a fresh strategy is
# validated on its first draw, which would otherwise dominate every step).


@cache
def _pages(config: ReserveConfig) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(-1, config.pages), max_size=5).map(tuple)


@cache
def _some_pages(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    if not pages:
        return _pages(config)
    chosen = st.lists(st.sampled_from(pages), min_size=1, max_size=len(pages), unique=True).map(tuple)
    return st.one_of(chosen, _pages(config))


@cache
def _one_page(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[int]:
    anything = st.integers(-1, config.pages)
    return st.one_of(st.sampled_from(pages), anything) if pages else anything


def _held(machine: Any) -> tuple[int, ...]:
    return tuple(held(machine.state()))


@cache
def _take(config: ReserveConfig) -> st.SearchStrategy[rev.TakePages]:
    return st.builds(rev.TakePages, st.integers(-1, config.pages + 1))


def draw_take(machine: Any) -> st.SearchStrategy[rev.TakePages]:
    return _take(machine.config)


def draw_touch(machine: Any) -> st.SearchStrategy[rev.Touch]:
    return _touch(machine.config)


@cache
def _touch(config: ReserveConfig) -> st.SearchStrategy[rev.Touch]:
    return st.builds(rev.Touch, _pages(config))


@cache
def _free(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[rev.FreePages]:
    return st.builds(rev.FreePages, _some_pages(config, pages))


def draw_free(machine: Any) -> st.SearchStrategy[rev.FreePages]:
    return _free(machine.config, _held(machine))


@cache
def _free_evict_first(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[rev.FreeEvictFirst]:
    return st.builds(rev.FreeEvictFirst, _some_pages(config, pages))


def draw_free_evict_first(machine: Any) -> st.SearchStrategy[rev.FreeEvictFirst]:
    return _free_evict_first(machine.config, _held(machine))


@cache
def _unpin(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[rev.Unpin]:
    return st.builds(rev.Unpin, _some_pages(config, pages))


def draw_unpin(machine: Any) -> st.SearchStrategy[rev.Unpin]:
    return _unpin(machine.config, _held(machine))


@cache
def _register(config: ReserveConfig, pages: tuple[int, ...]) -> st.SearchStrategy[rev.Register]:
    return st.builds(rev.Register, st.sampled_from(config.keys), _one_page(config, pages))


def draw_register(machine: Any) -> st.SearchStrategy[rev.Register]:
    return _register(machine.config, _held(machine))


@cache
def _forget(config: ReserveConfig) -> st.SearchStrategy[rev.Forget]:
    return st.builds(rev.Forget, st.integers(-1, config.pages))


def draw_forget(machine: Any) -> st.SearchStrategy[rev.Forget]:
    return _forget(machine.config)


def draw_reset(machine: Any) -> st.SearchStrategy[rev.ResetReserve]:
    return st.just(rev.ResetReserve())


@cache
def _lookup(config: ReserveConfig) -> st.SearchStrategy[rev.Lookup]:
    return st.builds(rev.Lookup, st.sampled_from(config.keys))


def draw_lookup(machine: Any) -> st.SearchStrategy[rev.Lookup]:
    return _lookup(machine.config)


# -- the explorer's ranges ---------------------------------------------------------------------


def _all_pages(config: ReserveConfig) -> range:
    return range(-1, config.pages + 1)


def explore_take(state: ReserveState, config: ReserveConfig) -> Iterator[rev.TakePages]:
    yield from (rev.TakePages(n) for n in (-1, 0, 1, 2))


def explore_touch(state: ReserveState, config: ReserveConfig) -> Iterator[rev.Touch]:
    for page in _all_pages(config):
        if not 0 <= page < len(state.refs) or state.refs[page] < config.max_references:
            yield rev.Touch((page,))


def explore_free(state: ReserveState, config: ReserveConfig) -> Iterator[rev.FreePages]:
    yield from (rev.FreePages((page,)) for page in _all_pages(config))
    pages = held(state)
    yield from (rev.FreePages((first, second)) for first in pages for second in pages if first != second)


def explore_free_evict_first(state: ReserveState, config: ReserveConfig) -> Iterator[rev.FreeEvictFirst]:
    yield from (rev.FreeEvictFirst((page,)) for page in _all_pages(config))
    pages = held(state)
    yield from (rev.FreeEvictFirst((first, second)) for first in pages for second in pages if first != second)


def explore_unpin(state: ReserveState, config: ReserveConfig) -> Iterator[rev.Unpin]:
    yield from (rev.Unpin((page,)) for page in _all_pages(config))


def explore_register(state: ReserveState, config: ReserveConfig) -> Iterator[rev.Register]:
    yield from (rev.Register(key, page) for key in config.keys for page in _all_pages(config))


def explore_forget(state: ReserveState, config: ReserveConfig) -> Iterator[rev.Forget]:
    yield from (rev.Forget(page) for page in _all_pages(config))


def explore_reset(state: ReserveState, config: ReserveConfig) -> Iterator[rev.ResetReserve]:
    yield rev.ResetReserve()


def explore_lookup(state: ReserveState, config: ReserveConfig) -> Iterator[rev.Lookup]:
    yield from (rev.Lookup(key) for key in config.keys)


def drain(state: ReserveState) -> list[Any]:
    """Free every held page, as often as it is held: then every page but the reserved is free."""
    return [rev.FreePages((page,)) for page in held(state) for _ in range(state.refs[page])]


def drained(state: ReserveState) -> bool:
    """Every page but the reserved is on the free queue."""
    return len(state.queue) == len(state.refs) - len(state.reserved)


# -- the registration ------------------------------------------------------------------------

RESERVE = Component(
    name="reserve",
    summary="the evictable reserve: vLLM's free-queue pool, whose cache holds no reference",
    state=ReserveState,
    events=(
        EventSpec(rev.TakePages, z3=("reserve_safety:allocate",), draw=draw_take, explore=explore_take),
        EventSpec(rev.Touch, ids=("pages",), z3=("reserve_safety:touch",), draw=draw_touch, explore=explore_touch),
        EventSpec(rev.FreePages, ids=("pages",), z3=("reserve_safety:free",), draw=draw_free, explore=explore_free),
        EventSpec(
            rev.FreeEvictFirst,
            ids=("pages",),
            z3=("reserve_safety:free_evict_first",),
            draw=draw_free_evict_first,
            explore=explore_free_evict_first,
        ),
        EventSpec(rev.Unpin, ids=("pages",), z3=("reserve_safety:unpin",), draw=draw_unpin, explore=explore_unpin),
        EventSpec(
            rev.Register,
            ids=("page",),
            z3=("reserve_safety:register",),
            draw=draw_register,
            explore=explore_register,
        ),
        EventSpec(rev.Forget, ids=("page",), z3=("reserve_safety:forget",), draw=draw_forget, explore=explore_forget),
        EventSpec(rev.ResetReserve, z3=("reserve_safety:reset",), draw=draw_reset, explore=explore_reset),
        EventSpec(rev.Lookup, read_only=True, gaps={Z: QUERY}, draw=draw_lookup, explore=explore_lookup),
    ),
    invariants=RESERVE_INVARIANTS,
    abstraction=lambda reserve: reserve.to_spec(),
    spec=spec_reserve,
    impl=impl_reserve,
    explored={
        "ci": (ReserveConfig(pages=3, keys=("a", "b")), ReserveConfig(pages=3, keys=("a", "b"), caching=False)),
        "deep": (ReserveConfig(pages=4, keys=("a", "b")), ReserveConfig(pages=4, keys=("a", "b"), caching=False)),
    },
    drain=drain,
    drained=drained,
    corpora=(
        Corpus("reserve", "devtools.vllm.variants:VARIANTS"),
        Corpus("reserve_encoding", "kvsched.proofs.reserve_safety:broken"),
    ),
    gaps={
        C: "the reserve has no CrossHair contracts: its machine, explorer and z3 proof check it",
        S: "safety mode reaches the reserve inside vLLM's pool adapter (make vllm), by its verbs",
    },
)
